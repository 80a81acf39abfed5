module floe.dev/services/tracer

go 1.26.0
