// End-to-end tests of grpcretry over the idempotency stores (PostgreSQL,
// Redis). Not published: never tagged, and no published module requires it.
//stormguard:unpublished
module github.com/stormguard/stormguard/grpcretry/test

go 1.26.0

require (
	github.com/jackc/pgx/v5 v5.12.0
	github.com/redis/go-redis/v9 v9.23.0
	github.com/stormguard/stormguard v0.1.0
	github.com/stormguard/stormguard/grpcretry v0.1.0
	github.com/stormguard/stormguard/idempotency/pgstore v0.1.0
	github.com/stormguard/stormguard/idempotency/redisstore v0.1.0
	google.golang.org/grpc v1.85.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/sync v0.23.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261110000943-09e21b237f2c // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)
