# kolo: build, demo, test, benchmark. `make help` lists the targets.
GO      ?= go
BIN     := bin
# Packages whose concurrency the race detector must check.
RACE_PKGS := ./internal/engine/... ./internal/gpu/... ./internal/timeline/... ./internal/transport/... ./internal/collective/... ./internal/rendezvous/... ./internal/launch/... ./internal/bootstrap/... ./internal/world/...
PYTHON  ?= /usr/bin/python3
# The interpreters of kolo.tensorflow's tests, the newest TensorFlow kolo supports and the oldest:
# TensorFlow needs numpy 2, Debian's PyTorch numpy 1, so each TensorFlow lives in a virtual
# environment of its own (scripts/tf_venv.sh newest|oldest, run by make deps).
TF_PYTHON ?= .venv/tf/bin/python
TF_OLDEST_PYTHON ?= .venv/tf-oldest/bin/python
# The engine as the Python package loads it (capi/), and the kolo command a wheel ships beside it.
PYLIB   := python/kolo/lib
# The interpreter of kolo.keras's tests on Keras 3's JAX backend (python/tests/kolo_keras): JAX
# and Keras in a virtual environment of their own, without TensorFlow (scripts/jax_venv.sh, run by
# make deps). test-python leaves them out of the system Python's run.
JAX_PYTHON ?= .venv/jax/bin/python
# The interpreter of kolo.keras's tests on Keras 3's PyTorch backend (python/tests/kolo_keras):
# PyPI's torch 2.15 and Keras in a virtual environment of their own, without TensorFlow or JAX
# (scripts/keras_torch_venv.sh, run by make deps).
KERAS_TORCH_PYTHON ?= .venv/keras-torch/bin/python

.PHONY: help deps demo-go build lib wheel demo test test-go test-race test-python test-torch test-tf test-tf-oldest test-keras-jax test-keras-torch test-deploy lint bench clean docker-e2e gpu-check

help:
	@echo "make demo   - build kolo and train a CNN on Fashion-MNIST with kolo.torch on 2 local ranks"
	@echo "make demo-go - the Go example: softmax regression on 4 local ranks"
	@echo "make test   - everything CI runs: lint, then every suite below, two at a time (TEST_JOBS=1: in turn)"
	@echo "              (test-go, test-race, test-torch, test-tf, test-tf-oldest, test-keras-jax, test-keras-torch, test-deploy)"
	@echo "make bench  - kolo bench allreduce side by side with the peers (see docs/benchmarks.md)"
	@echo "make lib    - build the engine library for the Python package ($(PYLIB)/libkolo.so)"
	@echo "make wheel  - dist/kolo-*.whl: kolo.torch, the engine and the kolo command (no Go needed to install);"
	@echo "              dist/kolo_horovod-*.whl: the opt-in horovod.* names and horovodrun (pip install kolo[horovod])"
	@echo "make docker-e2e - build the image, train on 2 containers x 2 ranks, kill one, SSH variant (docs/containers.md)"
	@echo "make gpu-check - kolo on CUDA tensors against NCCL, one GPU, under 10 minutes (docs/pytorch.md, \"CUDA tensors\")"

# Debian packages the demo and the tests use (PyTorch, OpenMPI, sshd, Slurm, the example's data),
# and TensorFlow's and JAX's virtual environments.
deps:
	scripts/deps.sh

build:
	$(GO) build -o $(BIN)/kolo ./cmd/kolo
	$(GO) build -o $(BIN)/softmax ./examples/softmax

lib:
	$(GO) build -buildmode=c-shared -o $(PYLIB)/libkolo.so ./capi
	CGO_ENABLED=0 $(GO) build -o $(PYLIB)/kolo ./cmd/kolo

# Two wheels: kolo, and kolo-horovod (python-horovod/), the opt-in `horovod` names over kolo.
wheel:
	$(PYTHON) -m pip wheel --no-build-isolation --no-deps -w dist . ./python-horovod

# The PyTorch example (examples/pytorch_mnist.py): a CNN on Fashion-MNIST, 2 ranks, ~2 minutes here.
demo: deps build lib
	PYTHONPATH=python $(BIN)/kolo run -np 2 $(PYTHON) examples/pytorch_mnist.py

# The Go example: softmax regression on generated data, 4 ranks, no Python (--oversubscribe: on
# machines with fewer CPUs too).
demo-go: build
	$(BIN)/kolo run -np 4 --oversubscribe $(BIN)/softmax

lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...

# The suites, two at a time (TEST_JOBS): most spend much of their time waiting (a stopped rank
# until its deadline, ranks starting up), so two fill a 2-core machine (11-12 min on a clean clone
# there, load average up to 6); four at a time loaded one to 10, where tests with a fixed time
# budget missed it; TEST_JOBS=1 runs them in turn. test-torch and test-go, the two that wait most,
# start first. -Otarget prints each suite's
# output whole when it ends, and scripts/timed.sh its wall-clock and CPU time; -k: a failed suite
# does not stop the others, so one run shows every failure. bin/ and the engine library are built
# first: the Python suites need them.
TEST_SUITES := test-torch test-go test-race test-tf test-tf-oldest test-keras-jax test-keras-torch test-deploy
TEST_JOBS ?= 2
test: deps lint
	$(MAKE) --no-print-directory build lib
	$(MAKE) --no-print-directory -k -j$(TEST_JOBS) -Otarget $(TEST_SUITES)

test-go:
	@scripts/timed.sh $@ $(GO) test -count=1 -timeout 30m ./...

test-race:
	@scripts/timed.sh $@ $(GO) test -count=1 -timeout 30m -race $(RACE_PKGS)
	@# The TCP transport's tests again with lazy meshes (what worlds use): every connection is
	@# then made by the call that first needs it, on both ends at once.
	@KOLO_TCP_TEST_LAZY=1 scripts/timed.sh "$@ (lazy TCP meshes)" $(GO) test -count=1 -race ./internal/transport/tcp/

# Every Python test starts real ranks with bin/kolo run; test_wheel.py builds and installs a wheel.
# kolo.tensorflow's (python/tests/kolo_tensorflow) run with the newest TensorFlow's interpreter and
# the oldest's (docs/tensorflow.md, "Install and run"); kolo.keras's on Keras 3's JAX and PyTorch
# backends with theirs (docs/keras.md).
test-python: test-torch test-tf test-tf-oldest test-keras-jax test-keras-torch

test-torch: build lib
	@scripts/timed.sh $@ $(PYTHON) -m pytest -q python/tests --ignore=python/tests/kolo_tensorflow --ignore=python/tests/kolo_keras

test-tf: build lib
	@scripts/timed.sh $@ $(TF_PYTHON) -m pytest -q python/tests/kolo_tensorflow

test-tf-oldest: build lib
	@scripts/timed.sh $@ $(TF_OLDEST_PYTHON) -m pytest -q python/tests/kolo_tensorflow

test-keras-jax: build lib
	@KERAS_BACKEND=jax scripts/timed.sh $@ $(JAX_PYTHON) -m pytest -q python/tests/kolo_keras

test-keras-torch: build lib
	@KERAS_BACKEND=torch scripts/timed.sh $@ $(KERAS_TORCH_PYTHON) -m pytest -q python/tests/kolo_keras

# Structure of the Kubernetes, compose and apptainer files that CI cannot run (docs/containers.md).
test-deploy:
	@scripts/timed.sh $@ $(PYTHON) -m unittest discover -s deploy -p 'test_*.py'

# Needs a Docker engine; builds images from source (see docs/containers.md for its duration).
docker-e2e:
	deploy/docker-e2e.sh

# The GPU check (scripts/gpu_check.sh). It builds nothing: a GPU machine may have no Go, so bin/ and
# python/kolo/lib/ come built (make build lib) with the repository. GPU_CHECK_ARGS=--device cpu runs
# its steps on CPU tensors.
gpu-check:
	scripts/gpu_check.sh $(GPU_CHECK_ARGS)

bench: build
	/usr/bin/python3 bench/compare.py --np 2 --sizes 4,4KiB,256KiB,4MiB,64MiB

clean:
	rm -rf $(BIN) $(PYLIB) build dist
