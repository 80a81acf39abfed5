module floe.dev/services/gateway

go 1.26.0
