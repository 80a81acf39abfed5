import { test } from 'node:test';
import assert from 'node:assert/strict';
import { toolSummary, lineDiff, toolDiff, lineCount } from '../app/toolview.js';

test('toolSummary: the command, the path, else the first string', () => {
  const cases = [
    ['exec_command', { description: 'List', cmd: 'ls  -la\n/tmp' }, '$ ls -la /tmp'],
    ['read_file', { file_path: 'src/main.go' }, 'src/main.go'],
    ['edit_file', { file_path: 'a.txt', old_string: 'x', new_string: 'y' }, 'a.txt'],
    ['run_subagent', { prompt: 'Count the files' }, 'Count the files'],
    ['mcp__fs__search', { limit: 3, query: 'needle' }, 'needle'],
    ['mcp__x__y', { n: 1 }, ''],
    ['exec_command', '{"cmd": "ec', ''],
  ];
  for (const [name, args, want] of cases) {
    const got = toolSummary(name, typeof args === 'string' ? args : JSON.stringify(args));
    assert.equal(got, want, name);
  }
  assert.equal(toolSummary('exec_command', JSON.stringify({ cmd: 'x'.repeat(300) })).length, 122); // '$ ' and 120
});

test('lineDiff keeps the common lines as context', () => {
  const d = lineDiff('a\nb\nc\nd\n', 'a\nB\nc\nd\ne\n');
  assert.deepEqual(d.map((l) => l.op + l.text), [' a', '-b', '+B', ' c', ' d', '+e']);
  assert.deepEqual(lineDiff('', 'x\ny').map((l) => l.op + l.text), ['+x', '+y']);
  assert.deepEqual(lineDiff('same', 'same').map((l) => l.op), [' ']);
});

test('lineDiff of large inputs stays bounded', () => {
  const a = Array.from({ length: 3000 }, (_, i) => 'a' + i).join('\n');
  const b = Array.from({ length: 3000 }, (_, i) => 'b' + i).join('\n');
  const d = lineDiff(a, b);
  assert.equal(d.length, 6000);
});

test('toolDiff for edit_file and write_file only', () => {
  const e = toolDiff('edit_file', JSON.stringify({ file_path: 'f.go', old_string: 'x := 1\n', new_string: 'x := 2\n' }));
  assert.equal(e.path, 'f.go');
  assert.deepEqual(e.lines.map((l) => l.op + l.text), ['-x := 1', '+x := 2']);
  const w = toolDiff('write_file', JSON.stringify({ file_path: 'n.txt', content: 'one\ntwo\n' }));
  assert.deepEqual(w.lines.map((l) => l.op + l.text), ['+one', '+two']);
  assert.equal(toolDiff('exec_command', '{"cmd":"ls"}'), null);
  assert.equal(toolDiff('edit_file', '{"file_path": "f'), null);
});

test('lineCount', () => {
  assert.equal(lineCount(''), 0);
  assert.equal(lineCount('a'), 1);
  assert.equal(lineCount('a\nb\n'), 2);
});
