module github.com/questrt/questrt

go 1.26.0

require (
	github.com/NVIDIA/go-nvml v0.13.4-1
	go.uber.org/goleak v1.3.0
	golang.org/x/sys v0.50.0
	gorgonia.org/cu v0.9.6
)

require (
	github.com/google/uuid v1.6.0 // indirect
	github.com/pkg/errors v0.9.1 // indirect
)
