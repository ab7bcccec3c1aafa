module github.com/gpumem/gpumem

go 1.26.0

require (
	github.com/google/btree v1.1.3
	github.com/google/pprof v0.0.0-20261105003125-4bf881d7fb0b
	github.com/nlpodyssey/gopickle v0.2.0
	github.com/prometheus/client_golang v1.25.0
	github.com/prometheus/client_model v0.6.3
	github.com/prometheus/common v0.72.0
	github.com/stretchr/testify v1.12.1
	golang.org/x/sync v0.25.0
	golang.org/x/term v0.48.0
	gorgonia.org/cu v0.9.6
	pgregory.net/rapid v1.3.0
)

require (
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/kylelemons/godebug v1.1.0 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/prometheus/procfs v0.22.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sys v0.50.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)
