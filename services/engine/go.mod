module floe.dev/services/engine

go 1.26.0

require floe.dev/pkg/omni v0.0.0
require floe.dev/pkg/bus v0.0.0

replace floe.dev/pkg/omni => ../../pkg/omni
replace floe.dev/pkg/bus => ../../pkg/bus
