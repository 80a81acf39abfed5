module floe.dev/pkg/procfs

go 1.26.0
