module floe.dev/services/engine

go 1.26.0
