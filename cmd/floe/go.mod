module floe.dev/cmd/floe

go 1.26.0

require floe.dev/pkg/omni v0.0.0
require floe.dev/pkg/bus v0.0.0
require floe.dev/services/engine v0.0.0
require floe.dev/services/toolrunner v0.0.0
require floe.dev/services/tracer v0.0.0
require floe.dev/services/gateway v0.0.0

replace floe.dev/pkg/omni => ../../pkg/omni
replace floe.dev/pkg/bus => ../../pkg/bus
replace floe.dev/services/engine => ../../services/engine
replace floe.dev/services/toolrunner => ../../services/toolrunner
replace floe.dev/services/tracer => ../../services/tracer
replace floe.dev/services/gateway => ../../services/gateway
