module floe.dev/cmd/floe

go 1.26.0
