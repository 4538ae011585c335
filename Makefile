# Run `make` for the list of targets. Integration tests need PostgreSQL:
# `make db-start` starts one (scripts/db-start.sh), or set TEST_DATABASE_URL.

SQLC := go tool -modfile=tools/go.mod sqlc

.DEFAULT_GOAL := help
.PHONY: help generate verify test test-short db-start demo stress bench lint

help: ## List the targets.
	@awk 'BEGIN { FS = ":.*## " } /^[a-z-]+:.*## / { printf "  %-11s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

generate: ## Render the templates (db/render), then regenerate gen/ with sqlc.
	go run ./db/render
	$(SQLC) generate

verify: db-start ## Fail when rendered files or gen/ are stale; sqlc vet on a migrated database; go vet.
	go run ./db/render -check
	$(SQLC) diff
	bash scripts/sqlc-vet.sh
	go vet ./...

test: db-start ## Unit and integration tests with the race detector.
	go test -race -count=1 ./...

test-short: ## Unit tests only; tests that need PostgreSQL skip.
	go test -short -count=1 ./...

db-start: ## Start the local PostgreSQL the tests use.
	bash scripts/db-start.sh

demo: db-start ## Run the leasectl demo.
	go run ./cmd/leasectl demo

stress: db-start ## Long reliability runs: 100k-message stress, faults, restart, differential, fuzz.
	bash scripts/stress.sh

bench: db-start ## Run the leasectl benchmark.
	go run ./cmd/leasectl bench --rounds 5

lint: ## go vet and gofmt.
	go vet ./...
	@out="$$(gofmt -l .)"; if [ -n "$$out" ]; then echo "gofmt -l reports:"; echo "$$out"; exit 1; fi
