package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"floe.dev/services/gateway/client"
)

// cmdSessions lists the recent Sessions, newest first: their titles,
// states and Workspaces (--json for the gateway's Session objects). It
// reads $FLOE_HOME in-process, or a running server with --server; when
// floe serve holds the home's store it asks that server instead.
func cmdSessions(ctx context.Context, _ context.CancelFunc, name string, args []string) (int, error) {
	fs := newFlags(name)
	c := newCommon("off")
	c.flagHome(fs)
	server := fs.String("server", "", "gateway URL to list from (token from FLOE_API_TOKEN); default: read --home")
	asJSON := fs.Bool("json", false, "print the Sessions as a JSON array (the gateway's Session objects)")
	limit := fs.Int("n", 20, "how many of the most recent Sessions to list (0: all)")
	all := fs.Bool("all", false, "include subagents' Sessions")
	if err := parse(fs, args); err != nil {
		return 2, err
	}
	if fs.NArg() != 0 {
		return 2, errors.New("usage: floe sessions [--json] [-n N] [--all] [--server URL]")
	}
	var list []client.Session
	var err error
	if *server != "" {
		list, err = serverClient(strings.TrimRight(*server, "/")).ListSessions(ctx)
	} else {
		list, err = sessionsDirect(ctx, c)
	}
	if err != nil {
		return 1, err
	}
	list = recentSessions(list, *limit, *all)
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if list == nil {
			list = []client.Session{}
		}
		return 0, enc.Encode(list)
	}
	if len(list) == 0 {
		fmt.Println("no Sessions yet: start one with floe chat")
		return 0, nil
	}
	writeSessions(os.Stdout, list, time.Local)
	return 0, nil
}

// recentSessions sorts newest first, drops subagents' Sessions unless
// all, and keeps the first limit (all when limit is 0).
func recentSessions(list []client.Session, limit int, all bool) []client.Session {
	out := list[:0:0]
	for _, s := range list {
		if all || s.Parent == "" {
			out = append(out, s)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].CreatedUnixMs > out[j].CreatedUnixMs })
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out
}

// sessionState is a Session's state as the list says it.
func sessionState(s client.Session) string {
	switch {
	case s.State != "" && s.State != "idle":
		return s.State
	case s.LastStatus != "":
		return "idle (" + s.LastStatus + ")"
	}
	return "idle"
}

// writeSessions prints the table: id, created, state, title, Workspace.
func writeSessions(w io.Writer, list []client.Session, loc *time.Location) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tCREATED\tSTATE\tTITLE\tWORKSPACE")
	home, _ := os.UserHomeDir()
	for _, s := range list {
		title := s.Title
		if title == "" {
			title = "(untitled)"
		}
		ws := s.Workspace
		if home != "" && (ws == home || strings.HasPrefix(ws, home+string(filepath.Separator))) {
			ws = "~" + ws[len(home):]
		}
		created := time.UnixMilli(s.CreatedUnixMs).In(loc).Format("Jan _2 15:04")
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.ID, created, sessionState(s), cutLine(title, 50), ws)
	}
	tw.Flush()
}

// cutLine is s on one line, at most n runes.
func cutLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// sessionsDirect lists the Sessions of c.home in-process; when a running
// floe serve holds the home's store, it asks that server (FLOE_HTTP_ADDR)
// instead.
func sessionsDirect(ctx context.Context, c *common) ([]client.Session, error) {
	var list []client.Session
	err := withDirectClient(ctx, c, "sessions", func(cl *client.Client) (err error) {
		list, err = cl.ListSessions(ctx)
		return err
	})
	if err != nil && errors.Is(err, errStoreOpen) {
		if l, serr := serverClient("http://" + c.httpAddr).ListSessions(ctx); serr == nil {
			return l, nil
		}
	}
	return list, err
}
