package bench

import (
	"slices"
	"testing"
)

// TestRowFilters: the row filters of the live scenarios select the rows
// their docs say: the default shared transport apart from its
// " + limiter" and WithLimit(nil) twins.
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
	const def, lim, off = "stormguard, one shared transport", "stormguard, one shared transport + limiter", "stormguard, one shared transport, WithLimit(nil)"
	for _, tt := range []struct {
		scenario, only string
		rows           func(string) []string
		want           []string
	}{
		{"meta", def, metaRows, []string{def}},
		{"meta", off, metaRows, []string{off}},
		{"meta", lim, metaRows, []string{lim}},
		{"meta", "shared transport + limiter", metaRows, []string{lim}},
		{"meta", "one shared transport", metaRows, []string{def, lim, off}},
		{"meta", def + "|" + off, metaRows, []string{def, off}},
		{"pos", def, posRows, []string{def}},
		{"pos", off, posRows, []string{off}},
		{"pos", lim, posRows, []string{lim}},
		{"pos", def + "|" + off, posRows, []string{def, off}},
	} {
		if got := tt.rows(tt.only); !slices.Equal(got, tt.want) {
			t.Errorf("%s rows %q = %q, want %q", tt.scenario, tt.only, got, tt.want)
		}
	}
}
