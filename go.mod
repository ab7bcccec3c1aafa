module github.com/gpumem/gpumem

go 1.26.0

require (
	github.com/google/btree v1.1.3
	github.com/google/pprof v0.0.0-20261105003125-4bf881d7fb0b
	github.com/nlpodyssey/gopickle v0.2.0
	github.com/stretchr/testify v1.12.1
	golang.org/x/sync v0.25.0
	golang.org/x/term v0.48.0
	gorgonia.org/cu v0.9.6
	pgregory.net/rapid v1.3.0
)

require (
	github.com/google/uuid v1.1.1 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sys v0.50.0 // indirect
)
