package bus_test

import (
	"bytes"
	"context"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/bustest"
	"floe.dev/pkg/omni"
)

// TestRecordsNameTheirCommandPolicy: a record rewritten for every Task
// carries its command policy's digest, not the policy (stored once per
// bucket, whatever the number of Sessions and writes); every read gives
// the policy back, List and Watch never show the policy's key, a record
// of before (its policy inline) still reads, and one whose policy is not
// stored reads as undecodable.
func TestRecordsNameTheirCommandPolicy(t *testing.T) {
	env := bustest.Start(t, bus.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	on := true
	policy := &omni.CommandPolicy{Source: "/etc/floe/policy.json", Rules: []omni.CommandRule{
		{Name: "no-rm", Pattern: `^rm\s+-rf-a-pattern-long-enough-to-see`, Description: "never", Enabled: &on},
		{Name: "no-dd", Pattern: `^dd\s`},
	}}
	watch, err := env.Sessions.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"s-1", "s-2"} {
		if err := env.Sessions.Create(ctx, &omni.SessionRecord{ID: id, Model: "m", CommandPolicy: policy}); err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			if _, err := env.Sessions.Begin(ctx, id, omni.StateRunning, "t"); err != nil {
				t.Fatalf("begin %d: %v", i, err)
			}
			if err := env.Sessions.End(ctx, id, "t", omni.StatusCompleted); err != nil {
				t.Fatalf("end %d: %v", i, err)
			}
		}
	}
	kv, err := env.JS.KeyValue(ctx, omni.SessionsBucket)
	if err != nil {
		t.Fatal(err)
	}
	// What the bucket holds: the policy's rules under one key, the
	// records only its digest.
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var withRules []string
	n := 0
	for k := range keys.Keys() {
		n++
		e, err := kv.Get(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(e.Value(), []byte("rf-a-pattern-long-enough")) {
			withRules = append(withRules, k)
		}
	}
	if len(withRules) != 1 || !strings.HasPrefix(withRules[0], "policy.") || n != 3 {
		t.Errorf("the bucket's keys with the policy's rules: %q of %d, want one policy key of 3", withRules, n)
	}
	for _, id := range []string{"s-1", "s-2"} {
		r, _, err := env.Sessions.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(r.CommandPolicy, policy) || r.CommandPolicyRef != "" {
			t.Errorf("Get(%s): policy %+v ref %q, want %+v", id, r.CommandPolicy, r.CommandPolicyRef, policy)
		}
		if r, _, err = env.Sessions.GetLatest(ctx, id); err != nil || !reflect.DeepEqual(r.CommandPolicy, policy) {
			t.Errorf("GetLatest(%s): policy %+v, %v", id, r.CommandPolicy, err)
		}
	}
	// A fresh store (another process) reads it from the bucket.
	other, err := bus.Open(ctx, env.JS)
	if err != nil {
		t.Fatal(err)
	}
	if r, _, err := other.Get(ctx, "s-1"); err != nil || !reflect.DeepEqual(r.CommandPolicy, policy) {
		t.Errorf("another store's Get: %+v, %v", r, err)
	}
	// A record of before this change: its policy inline.
	old, err := omni.Pack(&omni.SessionRecord{ID: "s-old", Model: "m", CommandPolicy: policy})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(ctx, "s-old", old); err != nil {
		t.Fatal(err)
	}
	if r, _, err := other.Get(ctx, "s-old"); err != nil || !reflect.DeepEqual(r.CommandPolicy, policy) {
		t.Errorf("a record with its policy inline: %+v, %v", r, err)
	}
	// A record naming a policy that is not stored.
	lost, err := omni.Pack(&omni.SessionRecord{ID: "s-lost", Model: "m", CommandPolicyRef: "0123456789abcdef0123456789abcdef"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(ctx, "s-lost", lost); err != nil {
		t.Fatal(err)
	}
	var ue *bus.UndecodableError
	if _, _, err := other.Get(ctx, "s-lost"); !errors.As(err, &ue) {
		t.Errorf("a record whose policy is not stored: %v, want an UndecodableError", err)
	}
	list, bad, err := env.Sessions.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range list {
		ids = append(ids, r.ID)
		if !reflect.DeepEqual(r.CommandPolicy, policy) {
			t.Errorf("List: %s's policy %+v", r.ID, r.CommandPolicy)
		}
	}
	if strings.Join(ids, ",") != "s-1,s-2,s-old" || len(bad) != 1 || bad[0].ID != "s-lost" {
		t.Errorf("List = %v, undecodable %v; want s-1, s-2, s-old and s-lost undecodable", ids, bad)
	}
	// Watch: the records' changes with their policy, never the policy's key.
	seen := map[string]bool{}
	deadline := time.After(30 * time.Second)
	for !seen["s-old"] {
		select {
		case c := <-watch:
			if c == nil {
				continue
			}
			if strings.HasPrefix(c.ID, "policy") || c.ID == "s-lost" {
				t.Fatalf("Watch sent %q", c.ID)
			}
			if !c.Deleted && !reflect.DeepEqual(c.Record.CommandPolicy, policy) {
				t.Errorf("Watch: %s's policy %+v", c.ID, c.Record.CommandPolicy)
			}
			seen[c.ID] = true
		case <-deadline:
			t.Fatalf("Watch sent %v within 30 s, want s-old too", seen)
		}
	}
	if err := env.Sessions.Delete(ctx, "s-1"); err != nil {
		t.Fatal(err)
	}
	if r, _, err := env.Sessions.Get(ctx, "s-2"); err != nil || !reflect.DeepEqual(r.CommandPolicy, policy) {
		t.Errorf("after another Session's delete: %+v, %v", r, err)
	}
}

// The stored policy follows the records: once the writes since it lag
// policyLag behind a record write, it is written again, so that it never
// keeps a sealed block of the bucket (and every old record version in
// it) alive (docs/operations.md "Retention and disk").
func TestStoredPolicyFollowsTheRecords(t *testing.T) {
	t.Parallel()
	env := bustest.Start(t, bus.Config{})
	ctx := context.Background()
	policy := &omni.CommandPolicy{Source: "/etc/floe/policy.json", Rules: []omni.CommandRule{{Name: "no-dd", Pattern: `^dd\s`}}}
	if err := env.Sessions.Create(ctx, &omni.SessionRecord{ID: "s-1", Model: "m", CommandPolicy: policy}); err != nil {
		t.Fatal(err)
	}
	kv, err := env.JS.KeyValue(ctx, omni.SessionsBucket)
	if err != nil {
		t.Fatal(err)
	}
	policyRev := func() uint64 {
		t.Helper()
		keys, err := kv.ListKeys(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for k := range keys.Keys() {
			if strings.HasPrefix(k, bus.PolicyKeyPrefix) {
				e, err := kv.Get(ctx, k)
				if err != nil {
					t.Fatal(err)
				}
				return e.Revision()
			}
		}
		t.Fatal("no policy stored")
		return 0
	}
	first := policyRev()
	var last uint64
	for i := range bus.PolicyLag + 50 {
		if _, err := env.Sessions.Update(ctx, "s-1", func(r *omni.SessionRecord) error { r.Title = strconv.Itoa(i); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if _, last, err = env.Sessions.Get(ctx, "s-1"); err != nil {
		t.Fatal(err)
	}
	if got := policyRev(); got == first || last-got > bus.PolicyLag+1 {
		t.Fatalf("policy at revision %d (first %d), the record at %d: want it within %d writes", got, first, last, bus.PolicyLag)
	}
	if r, _, err := env.Sessions.Get(ctx, "s-1"); err != nil || !reflect.DeepEqual(r.CommandPolicy, policy) {
		t.Fatalf("record after the policy was written again: %+v, %v", r, err)
	}
}
