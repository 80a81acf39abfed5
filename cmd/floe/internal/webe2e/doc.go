// Package webe2e holds the Web App's browser tests: real `floe serve`
// processes with the scripted model, driven through Debian's chromium
// (headless) with chromedp. scripts/test installs chromium when it is
// missing; without /usr/bin/chromium (or FLOE_CHROMIUM) the tests fail and
// say so.
//
// FLOE_UPDATE_SCREENSHOTS=1 writes the README's screenshots into docs/.
package webe2e
