// Package web holds the Web App's static files (ES modules, CSS, no build
// step), embedded into the gateway's binary and served at / (protocol.md §3
// "Browsers"). The view model (app/viewmodel.js) and the Markdown renderer
// (app/markdown.js) are pure modules; their unit tests run with
// `node --test services/gateway/web/test/*.test.mjs` (scripts/test runs them).
package web

import (
	"embed"
	"io/fs"
)

//go:embed app
var files embed.FS

// FS returns the app's files, rooted at the app folder (index.html at the
// top).
func FS() fs.FS {
	sub, err := fs.Sub(files, "app")
	if err != nil {
		panic(err) // the folder is embedded above; cannot fail
	}
	return sub
}
