package cmdpolicy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFactorySet(t *testing.T) {
	m, err := Compile(Factory())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		cmd  string
		want string // rule name, "" = allowed
	}{
		{"rm -rf /", "rm-recursive-force"},
		{"/bin/rm -fr x", "rm-recursive-force"},
		{`sudo "rm" -r -f d`, "rm-recursive-force"},
		{`bash -c 'rm -rf ~'`, "rm-recursive-force"},
		{`sh -lc "cd /tmp && rm -Rf build"`, "rm-recursive-force"},
		{`\rm --recursive --force dir`, "rm-recursive-force"},
		{"rm   -r\t x  -f", "rm-recursive-force"},
		{"sudo -u root env FOO=1 nice -n 5 /usr/bin/rm -rf /var", "rm-recursive-force"},
		{"find . -name '*.o' | xargs -0 rm -rf", "rm-recursive-force"},
		{"command rm -fr x", "rm-recursive-force"},
		{"cd /tmp; 'rm' -rf *", "rm-recursive-force"},
		{"echo $(rm -rf /)", "rm-recursive-force"},
		{"rm -r x", ""},
		{"rm -f x", ""},
		{"rm x y", ""},
		{"echo rm -rf", ""},
		{"grep -rf patterns.txt .", ""},
		{"git rm -r --cached dir", ""},
		{"rmdir -p a/b", ""},
		{"dd if=/dev/zero of=/dev/sda", "dd-block-device"},
		{"sudo dd if=img.iso of=/dev/nvme0n1 bs=4M", "dd-block-device"},
		{"dd if=/dev/zero of=disk.img bs=1M count=10", ""},
		{"dd if=/dev/urandom of=/dev/null count=1", ""},
		{"mkfs.ext4 /dev/sdb1", "mkfs"},
		{"sudo mkfs -t xfs /dev/vdb", "mkfs"},
		{"echo mkfs", ""},
		{"echo hi > /dev/null", ""},
		{"cat img > /dev/sda", "redirect-block-device"},
		{"echo hi 2>/dev/stderr", ""},
		{":(){ :|:& };:", "fork-bomb"},
		{":() { : | : & } ; :", "fork-bomb"},
		{"bomb(){ bomb|bomb& };bomb", "fork-bomb"},
		{"ls -la", ""},
		{"go test ./...", ""},
	}
	for _, tc := range tests {
		got, ok := m.Match(tc.cmd)
		if got.Name != tc.want || ok != (tc.want != "") {
			t.Errorf("Match(%q) = %q, %v; want %q", tc.cmd, got.Name, ok, tc.want)
		}
	}
}

func TestCandidates(t *testing.T) {
	got := Candidates(`sudo  "/bin/rm"   -r  -f d && bash -c 'echo  x'`)
	want := []string{`sudo "/bin/rm" -r -f d && bash -c 'echo x'`, "rm -r -f d", "bash -c 'echo  x'", "echo x", "echo x"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("Candidates = %q, want %q", got, want)
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if p, err := Load(""); err != nil || p.Source != SourceFactory || len(p.Rules) != 5 {
		t.Fatalf(`Load("") = %+v, %v; want the factory set`, p, err)
	}
	if p, err := Load("off"); err != nil || p.Source != SourceOff || len(p.Rules) != 0 {
		t.Fatalf(`Load("off") = %+v, %v; want no rules`, p, err)
	}
	good := write("good.json", `{"rules":[{"name":"no-curl","pattern":"^curl\\s","description":"no downloads"},{"name":"off","pattern":"^ls","enabled":false}]}`)
	p, err := Load(good)
	if err != nil || p.Source != good || len(p.Rules) != 2 {
		t.Fatalf("Load(good) = %+v, %v", p, err)
	}
	m, err := Compile(p)
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := m.Match("sudo /usr/bin/curl http://x"); !ok || r.Name != "no-curl" {
		t.Errorf("file rule did not match: %v %v", r, ok)
	}
	if _, ok := m.Match("ls -la"); ok {
		t.Error("a disabled rule matched")
	}
	if _, ok := m.Match("rm -rf /"); ok {
		t.Error("a rules file must replace the factory set")
	}
	for name, body := range map[string]string{
		"badre.json":   `{"rules":[{"name":"x","pattern":"(?<=a)b"}]}`,
		"noname.json":  `{"rules":[{"pattern":"a"}]}`,
		"nopat.json":   `{"rules":[{"name":"a"}]}`,
		"dup.json":     `{"rules":[{"name":"a","pattern":"a"},{"name":"a","pattern":"b"}]}`,
		"unknown.json": `{"rules":[],"extra":1}`,
		"norules.json": `{}`,
		"notjson.json": `rules: []`,
	} {
		if _, err := Load(write(name, body)); err == nil {
			t.Errorf("Load(%s) succeeded, want an error", name)
		}
	}
	if _, err := Load(filepath.Join(dir, "missing.json")); err == nil {
		t.Error("Load(missing file) succeeded")
	}
}

func TestNilPolicyIsFactory(t *testing.T) {
	m, err := Compile(nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := m.Match("rm -rf /"); !ok {
		t.Fatal("a record without a snapshot must get the factory set")
	}
	off, _ := Compile(Off())
	if _, ok := off.Match("rm -rf /"); ok {
		t.Fatal("off matched")
	}
}

func FuzzMatch(f *testing.F) {
	for _, s := range []string{"rm -rf /", `bash -c 'rm -rf ~'`, `"\`, `'`, "a\\\nb", "$(", ":(){ :|:& };:"} {
		f.Add(s)
	}
	m, _ := Compile(Factory())
	f.Fuzz(func(t *testing.T, s string) {
		m.Match(s) // must not panic
	})
}

func BenchmarkMatchFactory(b *testing.B) {
	m, _ := Compile(Factory())
	cmd := `cd /work/proj && sudo env GOFLAGS=-mod=mod go test ./... 2>&1 | tee out.txt; bash -c 'ls -la && echo done'`
	b.ReportAllocs()
	for b.Loop() {
		m.Match(cmd)
	}
}
