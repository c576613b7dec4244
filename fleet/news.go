package fleet

import (
	"context"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// subscriber is a backend that can subscribe to a channel (the Redis
// one; the tests' backends without it get no news).
type subscriber interface {
	subscribe(ctx context.Context, channel string) *redis.PubSub
}

// subscribe subscribes to channel. It dials at once (on the caller's
// goroutine: listen's), and the subscription comes back by itself after a
// lost connection.
func (r redisBackend) subscribe(ctx context.Context, channel string) *redis.PubSub {
	return r.client.Subscribe(ctx, channel)
}

// newsChannel is the fleet's channel of breaker openings: the script
// publishes on it each time a sync opens a host's breaker (see news in
// script.lua).
func (f *Fleet) newsChannel() string { return keyPrefix + "{" + f.cfg.Name + "}/open" }

// listen hears the fleet's openings until Close, and trips the breaker of
// each host it tracks whose opening it hears (see heard). Its first dial
// waits at most Config.Timeout; the subscription then reconnects by
// itself (go-redis) whenever its connection is lost.
func (f *Fleet) listen(sub subscriber) {
	defer close(f.listenDone)
	ctx, cancel := context.WithTimeout(f.ctx, f.cfg.Timeout)
	ps := sub.subscribe(ctx, f.newsChannel())
	cancel()
	defer ps.Close()
	ch := ps.Channel()
	for {
		select {
		case <-f.ctx.Done():
			return
		case m, ok := <-ch:
			if !ok {
				return
			}
			f.heard(m.Payload)
		}
	}
}

// heard acts on one opening, "<epoch> <server time, µs> <host's key>", as
// on a sync's reply that shows it (host.steer: a reply or an opening older
// than the newest one acted on is ignored), in fleet mode only. A message
// that does not parse, names a host this process does not track, or
// claims a time more than a minute past the newest reply's is ignored.
func (f *Fleet) heard(payload string) {
	if rest, ok := strings.CutPrefix(payload, "h "); ok {
		f.heardHold(rest)
		return
	}
	ep, rest, ok := strings.Cut(payload, " ")
	if !ok {
		return
	}
	at, key, ok := strings.Cut(rest, " ")
	if !ok || !strings.HasPrefix(key, f.keyPrefix) {
		return
	}
	epoch, err1 := strconv.ParseInt(ep, 10, 64)
	now, err2 := strconv.ParseInt(at, 10, 64)
	if err1 != nil || err2 != nil || epoch < 0 || !f.fleetMode() {
		return
	}
	if newest := f.newest.Load(); newest > 0 && now-newest > maxAhead {
		return // from the future: it would deafen a host to the fleet until then
	}
	f.mu.Lock()
	h := f.hosts[key[len(f.keyPrefix):]]
	f.mu.Unlock()
	if h != nil && h.steerWithin(fleetOpen, epoch, now, maxAhead) {
		f.news.Add(1)
	}
}
