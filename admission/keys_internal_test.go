package admission

import (
	"strconv"
	"testing"
	"time"
)

// TestKeyTableManyLiveKeys: 9,000 keys resending at once (450 payments a
// second, each resent for 20 s), every one seen again within the window:
// at least 90% are recognised as seen in every round. With one word per
// key (the table before it was set-associative) about 60% were: two keys
// sharing a word both looked new at each resend.
func TestKeyTableManyLiveKeys(t *testing.T) {
	const n = 9000
	now := time.Unix(1000, 0)
	tab := newKeyTable(now, 10*time.Second, 0)
	for i := range n {
		tab.seen("pay-"+strconv.Itoa(i), now)
	}
	for round := 1; round <= 3; round++ {
		now = now.Add(time.Second)
		hits := 0
		for i := range n {
			if tab.seen("pay-"+strconv.Itoa(i), now) {
				hits++
			}
		}
		if hits < n*9/10 {
			t.Errorf("round %d: %d of %d resends recognised, want >= 90%%", round, hits, n)
		}
		t.Logf("round %d: %d of %d resends recognised", round, hits, n)
	}
}

// TestKeyTableLongRetryAfter: with a Retry-After much longer than the
// window's slices can number (24 h, a 10 ms window: 1 ms slices), the
// table's slices are coarser and a key is still remembered past the
// Retry-After; with the window's slices it was forgotten after 2h20m.
func TestKeyTableLongRetryAfter(t *testing.T) {
	now := time.Unix(0, 0)
	tab := newKeyTable(now, 10*time.Millisecond, 24*time.Hour)
	if tab.seen("pay-1", now) {
		t.Fatal("a new key was seen")
	}
	for _, after := range []time.Duration{3 * time.Hour, 12 * time.Hour, 24 * time.Hour} {
		if !tab.seen("pay-1", now.Add(after)) {
			t.Errorf("key forgotten %v after it was seen, within the 24 h Retry-After", after)
		}
		now = now.Add(after)
	}
}
