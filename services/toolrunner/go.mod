module floe.dev/services/toolrunner

go 1.26.0
