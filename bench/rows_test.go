package bench

import (
	"slices"
	"testing"
)

// TestRowFilters: the row filters of the live scenarios select the rows
// their docs say, the default shared transport apart from its
// WithLimit(nil) twin, and the old name of the limiter row the default
// row.
func TestRowFilters(t *testing.T) {
	meta := metaSetups()
	pos := posSetups()
	metaRows := func(only string) []string {
		var out []string
		for _, s := range meta {
			if metaWanted(only, s.name, meta) {
				out = append(out, s.name)
			}
		}
		return out
	}
	posRows := func(only string) []string {
		var out []string
		for _, s := range pos {
			if posWanted(only, s.name, pos) {
				out = append(out, s.name)
			}
		}
		return out
	}
	const def, off = "stormguard, one shared transport", "stormguard, one shared transport, WithLimit(nil)"
	for _, tt := range []struct {
		scenario, only string
		rows           func(string) []string
		want           []string
	}{
		{"meta", def, metaRows, []string{def}},
		{"meta", off, metaRows, []string{off}},
		{"meta", "shared transport + limiter", metaRows, []string{def}},
		{"meta", "one shared transport", metaRows, []string{def, off}},
		{"meta", def + "|" + off, metaRows, []string{def, off}},
		{"pos", def, posRows, []string{def}},
		{"pos", off, posRows, []string{off}},
		{"pos", "stormguard, one shared transport + limiter", posRows, []string{def}},
		{"pos", def + "|" + off, posRows, []string{def, off}},
	} {
		if got := tt.rows(tt.only); !slices.Equal(got, tt.want) {
			t.Errorf("%s rows %q = %q, want %q", tt.scenario, tt.only, got, tt.want)
		}
	}
}
