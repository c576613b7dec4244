# Every module of the repository: each folder with a go.mod.
MODULES := $(shell find . -name go.mod -not -path './.git/*' -printf '%h\n' | sort)
STATICCHECK := go run honnef.co/go/tools/cmd/staticcheck@v0.8.2
GO_TEST_FLAGS ?=
BENCH ?= .
BENCHTIME ?= 1s

.PHONY: test fmt-check vet staticcheck test-race bench demo jitter modules

## test: gofmt check, go vet, staticcheck and go test -race in every module.
test: fmt-check vet staticcheck test-race

modules:
	@echo $(MODULES)

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

vet:
	@set -e; for m in $(MODULES); do echo "== go vet $$m"; (cd $$m && go vet ./...); done

staticcheck:
	@set -e; for m in $(MODULES); do echo "== staticcheck $$m"; (cd $$m && $(STATICCHECK) ./...); done

test-race:
	@set -e; for m in $(MODULES); do echo "== go test -race $$m"; (cd $$m && go test -race -count=1 $(GO_TEST_FLAGS) ./...); done

## bench: every benchmark of every module, with allocation counts.
bench:
	@set -e; for m in $(MODULES); do echo "== go test -bench $$m"; (cd $$m && go test -run='^$$' -bench='$(BENCH)' -benchmem -benchtime=$(BENCHTIME) ./...); done

## jitter: the seed's jitter table.
jitter:
	go run ./cmd/stormguard sim jitter
