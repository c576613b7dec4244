module github.com/stormguard/stormguard

go 1.25.0
