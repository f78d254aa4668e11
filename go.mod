module github.com/kolo-dl/kolo

go 1.26

require gopkg.in/yaml.v3 v3.0.1

require gonum.org/v1/gonum v0.17.0
