# Run `make` for the list of targets. Integration tests need PostgreSQL:
# `make db-start` starts one (scripts/db-start.sh), or set TEST_DATABASE_URL.

# The pinned tools (tools/go.mod). -modfile cannot be used in workspace
# mode, and the tools' dependencies must not join the workspace's build
# list, so they run with GOWORK=off.
TOOL := GOWORK=off go tool -modfile=$(CURDIR)/tools/go.mod
SQLC := $(TOOL) sqlc
STATICCHECK := $(TOOL) staticcheck

# The library's module and the modules beside it that hold what the library
# must not depend on: the integration suites (OTel SDK), the CLI (Prometheus
# exporter), the examples and the broker adapters (adapters/*). Each target
# that builds or tests runs in all.
# go.work lists them for editors and for working across them; each go.mod
# still builds alone.
MODULES := . integration cmd/leasectl examples adapters/natsjs adapters/rabbitmq adapters/kafka console/browsertest
in_modules = set -e; for m in $(MODULES); do (cd $$m && $(1)); done

.DEFAULT_GOAL := help
.PHONY: help generate verify test test-short db-start brokers-start demo stress bench bench-river lint

help: ## List the targets.
	@awk 'BEGIN { FS = ":.*## " } /^[a-z-]+:.*## / { printf "  %-11s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

generate: ## Render the templates (db/render), then regenerate gen/ with sqlc.
	go run ./db/render
	$(SQLC) generate

verify: db-start ## Fail when rendered files, gen/ or a go.mod are stale; sqlc vet; go vet.
	go run ./db/render -check
	$(SQLC) diff
	bash scripts/sqlc-vet.sh
	$(call in_modules,go vet ./...)
	$(call in_modules,go mod tidy -diff)
	cd tools && go mod tidy -diff

# The contract suite runs under -race once, on the Postgres store
# (TestPostgresContract). Its reruns through other connection modes, a
# pooler and the least-privilege roles send the same statements from the
# same Go code: they run without the detector, which took the leasing
# package past 8 minutes on 2 cores.
RACE_FREE := TestPostgresContractQueryModes|TestPgBouncerContract|TestRolesContract

test: db-start ## Unit, integration, CLI and example tests with the race detector.
	$(call in_modules,go test -race -count=1 -timeout 25m $$(test $$m = . && echo '-skip=^($(RACE_FREE))$$') $$(test $$m = integration && echo -p 1) ./...)
	go test -count=1 -timeout 25m -run '^($(RACE_FREE))$$' ./leasing

test-short: ## Unit tests only; tests that need PostgreSQL skip.
	$(call in_modules,go test -short -count=1 ./...)

db-start: ## Start the local PostgreSQL the tests use.
	bash scripts/db-start.sh

brokers-start: ## Start NATS (JetStream) and RabbitMQ for the adapters' tests unless they answer.
	bash scripts/brokers-start.sh

demo: db-start ## Two processor instances share the inbox and the outbox (examples/demo).
	cd examples && go run ./demo

stress: db-start ## Long reliability runs: 100k-message stress, faults, restart, differential, fuzz.
	bash scripts/stress.sh

bench: db-start ## Drain benchmark: API loop and processors against pgbench's raw loop (leasectl bench).
	cd cmd/leasectl && go run . bench --rounds 5 --processors

bench-river: db-start ## Processor beside River's bench configuration, alternating rounds (internal/bench/river).
	cd internal/bench/river && GOWORK=off go vet . && GOWORK=off go run . -jobs 100000 -rounds 3 && \
		GOWORK=off go run . -jobs 50000 -work 1ms -rounds 3

lint: ## go vet, staticcheck (pinned in tools/go.mod) and gofmt, in every module.
	$(call in_modules,go vet ./...)
	$(call in_modules,$(STATICCHECK) ./...)
	@out="$$(gofmt -l .)"; if [ -n "$$out" ]; then echo "gofmt -l reports:"; echo "$$out"; exit 1; fi

.PHONY: test-pg-newest
# The store's, the processor's and the migrations' tests: every statement,
# plan and privilege (MAINTAIN from 17 on) meets the newer server there. The
# integration suites drive the same statements from outside and stay on 15.
test-pg-newest: ## Store and migration tests on the newest PostgreSQL major from npm (scripts/pg-newest.sh).
	@url="$$(bash scripts/pg-newest.sh start)" && \
	TEST_DATABASE_URL="$$url" go test -count=1 -timeout 25m ./leasing/... ./db/...; \
	rc=$$?; bash scripts/pg-newest.sh stop; exit $$rc
