module floe.dev/pkg/sse

go 1.26.0
