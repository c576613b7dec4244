SHELL := /bin/bash

# Every module of the repository: each folder with a go.mod. Like the go
# command's ./... (and scripts/modcheck), the search skips testdata, vendor and
# folders whose name starts with "." or "_".
MODULES := $(shell find . -mindepth 1 -type d \( -name testdata -o -name vendor -o -name '.*' -o -name '_*' \) -prune -o -name go.mod -type f -printf '%h\n' | sort)
ROOT_MODULE := $(shell sed -n 's/^module //p' go.mod)
# The version every module is released at: the tags are v0.1.0 for the root
# and <folder>/v0.1.0 for the others, and siblings require each other at it.
RELEASE_VERSION ?= v0.1.0
STATICCHECK := go run honnef.co/go/tools/cmd/staticcheck@v0.8.2
# The scripts module needs no sibling, so its tools build without the
# workspace, even while a go.mod breaks it.
MODCHECK := cd scripts && GOWORK=off go run ./modcheck -version $(RELEASE_VERSION)
GO_TEST_FLAGS ?=
BENCH ?= .
BENCHTIME ?= 1s

# Shell snippets for the lines make test prints: NOW is the time in
# milliseconds; $(call TOOK,$$start) the time since start, as 0.4s, 12.3s or
# 2m05s.
NOW := $$(date +%s%3N)
TOOK = $$(awk -v ms=$$(( $$(date +%s%3N) - $(1) )) 'BEGIN { s = ms / 1000; if (s < 60) printf "%.1fs", s; else printf "%dm%02ds", int(s / 60), int(s) % 60 }')
# $(call EACH,step,command) runs command in every module: a line as each
# module starts, and one as it ends, with ok or FAIL and its time. It fails
# if the command failed in any module, after running it in all.
EACH = status=0; for m in $(MODULES); do echo "== $(1) $$m"; start=$(NOW); \
	if (cd $$m && $(2)); then r=ok; else r=FAIL; status=1; fi; \
	echo "== $(1) $$m: $$r in $(call TOOK,$$start)"; done; exit $$status

.PHONY: test fmt-check vet staticcheck modules-check layout-check test-race tidy release-tags bench demo jitter modules api demo-screenshot

TEST_STEPS := fmt-check vet staticcheck modules-check layout-check test-race

## test: gofmt check, go vet, staticcheck, module checks (tidy, adoption,
## graphs), layout checks (imports, sizes) and go test -race in every module,
## with a line as each module starts and ends (with its time); then the
## skipped tests and the totals, and the time of each step. Every step runs
## even if one before it failed; the last line names those that failed.
test:
	@failed=; took=; begin=$(NOW); for step in $(TEST_STEPS); do start=$(NOW); \
	  $(MAKE) --no-print-directory $$step || failed="$$failed $$step"; took="$$took $$step $(call TOOK,$$start),"; done; \
	echo "make test: took$${took%,}; total $(call TOOK,$$begin)"; \
	if [ -n "$$failed" ]; then echo "make test: failed:$$failed"; exit 1; fi

modules:
	@echo $(MODULES)

fmt-check:
	@out=$$(git ls-files -z --cached --others --exclude-standard '*.go' | xargs -0 -r sh -c 'for f; do [ -f "$$f" ] && echo "$$f"; done' sh | xargs -r gofmt -l); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

# vet and staticcheck check every module in one invocation from the
# workspace root (go.work makes each module's folder/... a package pattern
# there): the same packages and build list as one run per module, but the
# workspace is loaded, and the cached results of the packages the modules
# share are looked up, once instead of once per module (with warm caches,
# on this repository's 11 modules: go vet 34 s -> 5 s, staticcheck 48 s ->
# 7 s on a loaded 2-core machine).
ALL_PACKAGES := $(addsuffix /...,$(MODULES))
# $(call ALL,step,command) runs command once, with a line as it starts and
# one as it ends, with ok or FAIL and its time.
ALL = echo "== $(1) (all modules)"; start=$(NOW); if $(2); then r=ok; s=0; else r=FAIL; s=1; fi; \
	echo "== $(1) (all modules): $$r in $(call TOOK,$$start)"; exit $$s

vet:
	@$(call ALL,go vet,go vet $(ALL_PACKAGES))

staticcheck:
	@$(call ALL,staticcheck,$(STATICCHECK) $(ALL_PACKAGES))

## modules-check: every go.mod resolvable by users (module paths, no replace,
## siblings required at released versions, go.work), every module tidy with
## the workspace off, a module outside the repository that go gets the
## root and pgstore modules and builds, and lean module graphs (a module
## requiring only grpcretry or only otelstormguard lists no pgx, go-redis or
## OpenTelemetry SDK); see scripts/modcheck.
modules-check:
	@$(MODCHECK)

## layout-check: no shipped file imports another module's internal package,
## only the HTTP client adapters import httpretry, no non-test file over 600
## lines, no non-test function over 100 lines without a //stormguard:long
## reason; see scripts/layoutcheck.
layout-check:
	@cd scripts && GOWORK=off go run ./layoutcheck

## api: the exported names of every package a user can import (published
## modules, not internal, not main): top-level names, methods, fields; see
## scripts/apicount. API_FLAGS="-max-top 50 -max-total 450" fails above limits.
API_FLAGS ?=
api:
	@cd scripts && GOWORK=off go run ./apicount $(API_FLAGS)

## tidy: rewrite go.work and the go.mod/go.sum of every module that the
## modules check finds untidy.
tidy:
	@$(MODCHECK) -fix static tidy

## test-race: go test -race in every module (with -parallel from
## RACE_PARALLEL for the modules it lists), then go test without -race on
## the packages of NORACE_PKGS (NORACE_JOBS runs at a time, their outputs
## in list order), read by scripts/testsum, which prints what go
## test prints (and the lines as each module starts and ends), then why tests
## were skipped, then the totals.
## With STORMGUARD_REQUIRE_SERVICES=1, a store test without its service fails.
test-race:
	@set -o pipefail; bin=$$(mktemp -d); trap 'rm -rf "$$bin"' EXIT; \
	(cd scripts && GOWORK=off go build -o "$$bin/testsum" ./testsum) || exit 1; \
	{ ( $(call EACH,go test -race,go test -race -count=1 -json $(GO_TEST_FLAGS) $(MODULE_FLAGS) ./...) ); race=$$?; \
	  ( $(NORACE) ); exit $$(( race | $$? )); } \
	| "$$bin/testsum" -trim $(ROOT_MODULE)

# RACE_PARALLEL lists modules whose parallel tests mostly wait on real time,
# as module:N: test-race runs their go test with -parallel N instead of the
# default (GOMAXPROCS, 2 on CI), so that they overlap instead of leaving a
# core idle. bench: its live smoke scenarios (TestLiveMetaSmoke,
# TestLivePOSSmoke, TestLivePOSRetries, TestLivePeerSetups: loopback
# providers and terminals, each subtest t.Parallel, seconds of real time at
# a fifth of a core under -race) check counts, not timings; at -parallel 2
# they took 60 of the module's 63 s under -race for 25 CPU-s. Running them
# 6 at a time also found a data race in httpretry's options (fixed).
# bench stays under -race: its setups drive stormguard's transports, guards
# and limiters under live load, and its race-only build costs little once
# the other modules are built (18 CPU-s, about what a build without -race
# would cost it). cmd/stormguard: the four tests that run the demo for real
# (see its TestMain), 40 s together, a core between them, counts checked.
RACE_PARALLEL := ./bench:6 ./cmd/stormguard:4
# MODULE_FLAGS is the shell word list of extra go test flags for module $$m.
MODULE_FLAGS = $$(for mp in $(RACE_PARALLEL); do [ "$${mp%%:*}" = "$$m" ] && echo "-parallel $${mp\#*:}"; done)

# NORACE_PKGS are tests that test-race runs a second time without -race,
# each as module:package[:regexp] (the package as go test names it from the
# module's folder; the tests that match the regexp, or all). The race
# detector makes them three to ten times slower:
#  - the heaviest simulations of internal/sim, single-goroutine models in
#    files built only without -race (//go:build !race), where the detector
#    has nothing to watch; smaller runs of the same models stay under -race;
#  - the end-to-end idempotency runs, 1,000 payments under -race
#    (idemtest.RacePayments: the same code paths and faults) and the full
#    10,000 (idemtest.DefaultPayments) here;
#  - the allocation tests of httpretry and grpcretry, which skip under -race
#    (sync.Pool drops items there), so that their promises are checked;
#  - httpretry's overload recovery with and without hedging at full size
#    (ten seeds of 60 s of simulated time, 52,000 calls each, 20 s; 4x
#    slower under -race, where two seeds run);
#  - fleet's models of its fleet-wide rate, which drive the real script on
#    Redis from one goroutine (fleet/lowvolume_test.go, //go:build !race);
#  - package limit, whose tests run at full size here: the Baseline tests'
#    minutes of model time (14 CPU-s under -race, 2.4 without), the
#    100,000 callers of the bound tests (issue 20; 26 CPU-s under -race,
#    2.8 without), the other long load runs; under -race shorter runs and
#    20,000 callers (raceEnabled in limit/race_test.go), the same code for
#    the detector (63 -> 29 CPU-s); 9 CPU-s here;
#  - package admission, whose simulations run at full length here (the
#    naive clients: a 10 s trigger, 30-35 s, a goroutine per payment, 27
#    CPU-s under -race, 6 without; the adaptive limit, 10 s); under -race
#    a 4 s trigger, 12-14 s, and 4 s (admission/race_test.go); 9 CPU-s here.
NORACE_PKGS := cmd/stormguard:./internal/sim .:./idempotency:^TestEndToEnd \
	idempotency/pgstore:.:^TestEndToEnd idempotency/redisstore:.:^TestEndToEnd \
	.:./httpretry:Allocs .:./httpretry:^TestHedgeOverloadRecovery grpcretry:.:Allocs fleet:.:^TestScriptFleet \
	.:./limit .:./admission .:./breaker:^TestAttackCounterSaturation
# NORACE_JOBS is how many NORACE_PKGS runs go at once. Several of them
# wait more than they compute (the stores' end-to-end runs on PostgreSQL
# and Redis, fleet's models on Redis), so they overlap with those that
# compute (the simulations, the builds). No run checks a timing. Each run's output waits in a file and is printed, in
# NORACE_PKGS order, once the run and those before it in the list are over.
NORACE_JOBS ?= 3
# $(NORACE) runs the NORACE_PKGS runs, NORACE_JOBS at a time, each with a
# line as it starts and one as it ends (with ok or FAIL and its time); it
# fails if any run failed. NORACE_FLUSH prints the outputs that are ready.
NORACE_FLUSH = while [ $$next -lt $$n ] && [ -e "$$out/$$next.done" ]; do cat "$$out/$$next"; \
	[ -e "$$out/$$next.failed" ] && status=1; next=$$((next + 1)); done
NORACE = status=0; out=$$(mktemp -d); trap 'rm -rf "$$out"' EXIT; n=0; next=0; \
	for mpr in $(NORACE_PKGS); do m=$${mpr%%:*}; pr=$${mpr\#*:}; p=$${pr%%:*}; r=; \
	case $$pr in *:*) r=$${pr\#*:};; esac; \
	while [ $$(jobs -rp | wc -l) -ge $(NORACE_JOBS) ]; do wait -n; $(NORACE_FLUSH); done; \
	( echo "== go test (no -race) $$m $$p $$r"; start=$(NOW); \
	  if (cd $$m && go test -count=1 -json $(GO_TEST_FLAGS) $${r:+-run "$$r"} $$p); then ok=ok; else ok=FAIL; touch "$$out/$$n.failed"; fi; \
	  echo "== go test (no -race) $$m $$p $$r: $$ok in $(call TOOK,$$start)"; touch "$$out/$$n.done" ) > "$$out/$$n" 2>&1 & \
	n=$$((n + 1)); done; wait; $(NORACE_FLUSH); exit $$status

## release-tags: annotated tags $(RELEASE_VERSION) (root) and
## <folder>/$(RELEASE_VERSION) for every other published module, at HEAD
## (not the modules whose go.mod says //stormguard:unpublished: bench,
## scripts, the test-only modules).
release-tags:
	@bash scripts/tag-release $(RELEASE_VERSION)

## bench: every benchmark of every module, with allocation counts.
bench:
	@set -e; for m in $(MODULES); do echo "== go test -bench $$m"; (cd $$m && go test -run='^$$' -bench='$(BENCH)' -benchmem -benchtime=$(BENCHTIME) ./...); done

## demo-screenshot: runs the demo (its defaults, about a minute) with its live
## page open in headless Chromium (apt-get install chromium), writes a
## screenshot of the page once the runs are over to docs/demo-live.png and
## the same run's chart to docs/demo.png, and prints its output.
demo-screenshot:
	cd cmd/stormguard && STORMGUARD_DEMO_SCREENSHOT=$(CURDIR)/docs/demo-live.png go test -count=1 -run '^TestDemoScreenshot$$' -v .

## jitter: the reference jitter table of docs/backoff.md.
jitter:
	go run ./cmd/stormguard sim jitter
