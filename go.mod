module github.com/kolo-dl/kolo

go 1.26.0

require gopkg.in/yaml.v3 v3.0.1

require gonum.org/v1/gonum v0.17.0

require (
	github.com/prometheus/client_golang v1.25.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
	golang.org/x/term v0.48.0 // indirect
)
