# make test : what CI runs (.ci/run): installs redis-server if missing, then
#             gofmt check, go vet, go test -race over every package against a
#             private redis-server, and the Redis-facing packages once more
#             against a private 3-master, 3-replica Redis Cluster (in
#             guard the tests marked clusterToo), then
#             the fault suite (faults/: Redis killed, frozen, flushed, full,
#             slowed, blackholed, reset, a cluster master killed, TLS) and
#             its table.
# make demo : the demo shop (examples/shop): seeds SQLite, starts its own
#             redis-server, attacks itself with and without the guard, prints
#             the table and keeps serving until Ctrl-C
#             (make demo DEMO_ARGS=-exit stops after the table).
# make chaos: the whole deployment (three services, the follower and a
#             standby, the cacheguard command) as OS processes under a fault
#             schedule drawn from SEED, for DURATION, its history checked by
#             chaos.Check; the report goes to chaos/latest.md (REPORT=...)
#             and it fails on a violation, a false not-found or a 503 with
#             Redis up (make chaos DURATION=10m SEED=7; a new seed if unset;
#             CLUSTER=1 on a Redis Cluster, with master failovers and slot
#             migrations). make test runs it for a minute.
# make bench: the benchmarks, with allocations.
# make miss-files: the library files one plain miss runs through (coverage).
GO ?= go
PKGS := ./...

.PHONY: test chaos demo quickstart bench deps deps-demo fmt-check source-check release-check vet fuzz miss-files

# What each target needs, and nothing more: the demo, quickstart and bench
# need redis-server; make test also PostgreSQL and chromium.
deps:
	@./scripts/ensure-deps.sh test

deps-demo:
	@./scripts/ensure-deps.sh demo

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# Line length, doc comments of at most 15 lines, no lab notes in library
# comments (scripts/check-source.sh says why).
source-check:
	@./scripts/check-source.sh

# A module that requires one side module alone builds (scripts/check-release.sh).
release-check:
	@./scripts/check-release.sh

vet:
	$(GO) vet $(PKGS)

# The Redis-facing packages, run a second time on a private Redis Cluster
# (CG_TEST_CLUSTER=1). In guard that pass runs only the tests marked
# clusterToo(t) (guard/cluster_test.go); the standalone pass runs them all.
# A test that starts a cluster of its own and fails it over is in faults/.
CLUSTER_PKGS := ./bloom ./lock ./loader ./guard ./internal/cputime

# Modules of their own beside the root (so the root module needs neither Echo, Gin,
# chi, Prometheus nor pgx), vetted and tested like the root.
SIDE_MODULES := adapters/echo adapters/echov5 adapters/gin examples/chi guardprometheus follow/postgres

# Parallel tests (the slow ones that use their own keys or servers) run 4
# at a time: most of their time is waiting on Redis and child processes.
# The root module, the cluster pass and the fault suite run one after
# another: run at once on 2 cores they starved each other into timeouts.
# The adapters, chi, guardprometheus and benchmarks/ (its unit tests, and the
# build that make bench runs) are tested side by side (scripts/modules.sh):
# their tests are short and wait on servers of their own. follow/postgres and
# the shop run alone: beside other modules' compiles or tests, a starved
# machine made TestInspectorCleanRun's readers miss their wait, and the
# demo's Redis reads run past their deadline (a WARN TestDemoTable refuses).
# -vet=all is go vet's whole set, run on the race build's own compile (a
# separate go vet compiled every package once more).
TEST := $(GO) test -race -vet=all -count=1 -parallel 4

test: deps fmt-check source-check
	$(TEST) -timeout 15m $(PKGS)
	@./scripts/modules.sh '$(TEST) -timeout 10m ./...' $(filter-out follow/postgres,$(SIDE_MODULES)) benchmarks
	cd follow/postgres && $(TEST) -timeout 10m ./...
	cd examples/shop && $(TEST) -timeout 10m ./...
	@./scripts/check-release.sh
	CG_TEST_CLUSTER=1 $(TEST) -timeout 15m $(CLUSTER_PKGS)
	cd faults && FAULTS_TABLE=$(CURDIR)/faults/latest.md $(TEST) -timeout 10m ./...
	@cat faults/latest.md
	cd chaos && $(TEST) -short ./...
	@$(MAKE) --no-print-directory chaos DURATION=60s SEED=1

# The deployment's processes run without -race: on two cores the race
# detector's slowdown would be what the run measures.
DURATION ?= 10m
SEED ?=
REPORT ?= $(CURDIR)/chaos/latest.md
CLUSTER ?=
chaos: deps
	cd chaos && CHAOS_DURATION=$(DURATION) CHAOS_SEED=$(SEED) CHAOS_REPORT=$(REPORT) CHAOS_CLUSTER=$(CLUSTER) \
		$(GO) test -count=1 -run '^TestChaos$$' -timeout 0 -v .

DEMO_ARGS ?=
# CHART=docs/demo.png redraws the chart the docs show; by default make demo
# leaves the tracked tree as it was.
CHART ?=

# Built first, with a line every 10 s while the go command downloads and
# compiles (scripts/progress.sh), so a first run does not look hung.
demo: deps-demo
	@echo "demo: building the shop (a first run downloads and compiles its Go modules: a few minutes)"
	@mkdir -p bin && ./scripts/progress.sh "building the shop" sh -c 'cd examples/shop && $(GO) build -o ../../bin/shop .'
	./bin/shop demo $(if $(CHART),-chart $(CHART)) $(DEMO_ARGS)

quickstart: deps-demo
	@echo "quickstart: building (a first run downloads Go modules)"
	$(GO) run ./examples/quickstart

# The files a plain miss runs through, by coverage (scripts/miss-files.sh);
# MAX=n fails above n files.
miss-files: deps-demo
	@./scripts/miss-files.sh

# The side-by-side run against the peers (benchmarks/, its own module), then
# the library's own go test benchmarks (one iteration of the 10M-ID rebuild).
bench: deps-demo
	cd benchmarks && $(GO) run . -json results/latest.json
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 1s $(PKGS)

# Longer fuzzing than the seeds every `go test` runs.
fuzz:
	$(GO) test -run '^$$' -fuzz FuzzDecode -fuzztime 60s ./codec
	$(GO) test -run '^$$' -fuzz FuzzKeyEncoding -fuzztime 60s ./internal/keyspace
