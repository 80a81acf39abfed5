package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/rs/zerolog"

	"floe.dev/cmd/floe/internal/reexec"
	"floe.dev/cmd/floe/internal/stack"
	"floe.dev/pkg/bus"
	"floe.dev/pkg/bus/embed"
	"floe.dev/pkg/omni"
	"floe.dev/pkg/trace"
)

// replayExecute re-executes a recorded Session (protocol.md §8): the Trace file
// given, or the Session's Trace files under c.home (whose Session record,
// when the store can be opened, gives its maxTurns and compaction
// settings). It prints whether the new Trace equals the recorded one
// (with diff, the first difference with context) and exits 1 when not,
// 2 when it could not replay (as diff(1)): a script that gates on the
// exit status never reads "cannot open the store" as "behaviour changed".
// exitTrouble is replay --execute's exit status when it could not replay.
const exitTrouble = 2

func replayExecute(ctx context.Context, c *common, sid, traceFile string, diff bool) (int, error) {
	var records []omni.Message
	log, closeLog := c.quietLogger("replay")
	defer closeLog()
	opt := reexec.Options{Log: log}
	find := reexec.HomeFinder(c.home)
	if traceFile != "" {
		find = reexec.DirFinder(filepath.Dir(traceFile))
		msgs, err := reexec.ReadFile(traceFile)
		if err != nil {
			return exitTrouble, err
		}
		records = msgs
	} else {
		files, err := trace.Files(c.home, sid)
		if err != nil {
			return exitTrouble, err
		}
		if len(files) == 0 {
			return exitTrouble, fmt.Errorf("session %s has no Trace under %s", sid, c.home)
		}
		for _, f := range files {
			msgs, err := reexec.ReadFile(f)
			if err != nil {
				return exitTrouble, err
			}
			records = append(records, msgs...)
		}
		if rec, err := sessionRecord(ctx, c, sid, log); err == nil {
			opt.MaxTurns, opt.Compaction = rec.MaxTurns, rec.Compaction
		} else if errors.Is(err, embed.ErrStoreInUse) {
			// A running server holds the store (protocol.md §8: stop it
			// first): replaying without the Session's settings could
			// part from the record for that alone, read as a changed
			// engine.
			return exitTrouble, err
		} else {
			fmt.Fprintf(os.Stderr, "floe replay: the Session's settings are not readable (%v); replaying with the defaults\n", err)
		}
	}
	// Subagent children replay from their own Traces.
	kids, err := reexec.LoadChildren(records, find)
	if err != nil {
		return exitTrouble, err
	}
	opt.Children = kids
	res, err := reexec.Run(ctx, records, opt)
	if err != nil {
		return exitTrouble, err
	}
	if res.Equal() {
		fmt.Printf("equal: %d records replayed exactly\n", len(records))
		return 0, nil
	}
	if res.Diff >= 0 {
		fmt.Printf("different: the replay parts from the record at record %d of %d\n", res.Diff+1, len(records))
		if diff {
			reexec.PrintDiff(os.Stdout, records, res.Records, res.Diff, 3)
		}
	}
	for _, k := range res.Children {
		if k.Diff < 0 {
			continue
		}
		fmt.Printf("different: subagent %s parts from its record at record %d of %d\n", k.Recorded, k.Diff+1, len(k.Want))
		if diff {
			reexec.PrintDiff(os.Stdout, k.Want, k.Records, k.Diff, 3)
		}
	}
	return 1, nil
}

// sessionRecord reads a Session's record from c.home's store (an embedded
// bus on it, refused while a server holds it).
func sessionRecord(ctx context.Context, c *common, sid string, log zerolog.Logger) (*omni.SessionRecord, error) {
	busCfg, err := c.busConfig()
	if err != nil {
		return nil, err
	}
	st, err := stack.Start(ctx, stack.Options{Home: c.home, Listen: "off", Bus: busCfg}, log)
	if err != nil {
		return nil, fmt.Errorf("open %s (stop the server that holds it): %w", c.home, err)
	}
	defer st.Stop()
	rec, _, err := st.Sessions.Get(ctx, sid)
	if errors.Is(err, bus.ErrSessionNotFound) {
		return nil, fmt.Errorf("session %s not found", sid)
	}
	return rec, err
}
