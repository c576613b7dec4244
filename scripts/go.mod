// The repository's tools (module checks, test summary, API count).
// Not published: never tagged, and no published module requires it.
//stormguard:unpublished
module github.com/stormguard/stormguard/scripts

go 1.26.0

require golang.org/x/mod v0.41.0
