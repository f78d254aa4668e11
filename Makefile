# kolo: build, demo, test, benchmark. `make help` lists the targets.
GO      ?= go
BIN     := bin
# Packages whose concurrency the race detector must check.
RACE_PKGS := ./engine/... ./transport/... ./collective/... ./rendezvous/... ./launch/...

.PHONY: help build demo test test-race lint bench clean

help:
	@echo "make demo   - build kolo and train the example on 4 local ranks"
	@echo "make test   - everything CI runs: lint, unit, race, multi-process tests"
	@echo "make bench  - kolo bench allreduce side by side with the peers (see docs/benchmarks.md)"

build:
	$(GO) build -o $(BIN)/kolo ./cmd/kolo
	$(GO) build -o $(BIN)/softmax ./examples/softmax

demo: build
	$(BIN)/kolo run -np 4 $(BIN)/softmax

lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...

test: lint
	$(GO) test -count=1 ./...
	$(GO) test -count=1 -race $(RACE_PKGS)

bench: build
	/usr/bin/python3 bench/compare.py --np 2 --sizes 4,4KiB,256KiB,4MiB,64MiB

clean:
	rm -rf $(BIN)
