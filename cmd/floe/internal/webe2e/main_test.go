package webe2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/chromedp/chromedp"

	"floe.dev/cmd/floe/internal/proctest"
)

var (
	floeBin  string          // the floe binary, built once
	browser  context.Context // the shared chromium; each test opens its own tab
	chromium string
)

func TestMain(m *testing.M) {
	proctest.ExitIfShort("webe2e")
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "floe-webe2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if floeBin, err = proctest.BuildFloe(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	chromium = os.Getenv("FLOE_CHROMIUM")
	if chromium == "" {
		chromium = "/usr/bin/chromium"
	}
	if _, err := os.Stat(chromium); err != nil {
		fmt.Fprintf(os.Stderr, "webe2e: no chromium at %s (scripts/test installs it: apt-get install -y chromium)\n", chromium)
		return 1
	}
	profile := filepath.Join(dir, "profile")
	actx, acancel := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chromium),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.UserDataDir(profile),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-background-timer-throttling", true),
		chromedp.Flag("disable-renderer-backgrounding", true),
		chromedp.Flag("disable-backgrounding-occluded-windows", true),
		chromedp.Flag("metrics-recording-only", true),
		chromedp.Flag("password-store", "basic"),
		chromedp.Flag("force-color-profile", "srgb"),
		chromedp.WindowSize(1200, 760),
	)
	defer acancel()
	bctx, bcancel := chromedp.NewContext(actx)
	defer bcancel()
	// Start the browser now, with a context that lives as long as the tests.
	if err := chromedp.Do(bctx); err != nil {
		fmt.Fprintf(os.Stderr, "webe2e: start chromium: %v\n", err)
		return 1
	}
	browser = bctx
	return m.Run()
}
