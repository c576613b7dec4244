package fleet

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
)

// redisCluster is a Redis Cluster the test started on free loopback
// ports: three masters with one replica each.
type redisCluster struct {
	t     *testing.T
	nodes map[string]*redisServer // by address
}

// clusterNodeTimeout is the cluster's node timeout: a master that does not
// answer for that long is failed over to its replica.
const clusterNodeTimeout = time.Second

// startRedisCluster starts six cluster-enabled redis-servers and joins
// them with redis-cli --cluster create (three masters, a replica each),
// and waits until every node sees the cluster ok and every replica is in
// sync. Every server is killed when t ends, whatever happens.
func startRedisCluster(t *testing.T) *redisCluster {
	t.Helper()
	cli := lookTool(t, "redis-cli")
	dir := t.TempDir()
	c := &redisCluster{t: t, nodes: map[string]*redisServer{}}
	var addrs []string
	for range 6 {
		// Up to three pairs of ports: a port freePort found free may be
		// taken by another socket before the server binds it (once in a
		// run of the package under -race: the node did not answer).
		var s *redisServer
		var err error
		for try := 0; try < 3 && s == nil; try++ {
			port, bus := freePort(t), freePort(t)
			s, err = tryRedisServer(t, port, "--cluster-enabled", "yes", "--cluster-port", strconv.Itoa(bus),
				"--cluster-config-file", filepath.Join(dir, fmt.Sprintf("nodes-%d.conf", port)),
				"--cluster-node-timeout", strconv.Itoa(int(clusterNodeTimeout/time.Millisecond)), "--dir", dir)
		}
		if s == nil {
			t.Fatal(err)
		}
		c.nodes[s.addr()] = s
		addrs = append(addrs, s.addr())
	}
	args := append(append([]string{"--cluster", "create"}, addrs...), "--cluster-replicas", "1", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	c.waitHealthy(30 * time.Second)
	return c
}

// addrs returns the addresses of every node started, dead or alive.
func (c *redisCluster) addrs() []string {
	var out []string
	for a := range c.nodes {
		out = append(out, a)
	}
	return out
}

// do runs a command on node addr alone, with a short timeout.
func (c *redisCluster) do(addr string, args ...any) *redis.Cmd {
	cl := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return cl.Do(ctx, args...)
}

// alive returns the addresses of the nodes not killed.
func (c *redisCluster) alive() []string {
	var out []string
	for a, s := range c.nodes {
		if s.cmd.ProcessState == nil {
			out = append(out, a)
		}
	}
	return out
}

// waitHealthy waits until every live node reports the cluster ok, knows
// every live node, and every live replica's link to its master is up;
// it fails t after d.
func (c *redisCluster) waitHealthy(d time.Duration) {
	c.t.Helper()
	var why string
	ok := eventually(d, func() bool {
		for _, a := range c.alive() {
			info, err := c.do(a, "CLUSTER", "INFO").Text()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				why = fmt.Sprintf("%s: CLUSTER INFO %q, %v", a, info, err)
				return false
			}
			repl, err := c.do(a, "INFO", "replication").Text()
			if err != nil || (strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up")) {
				why = fmt.Sprintf("%s: INFO replication %q, %v", a, repl, err)
				return false
			}
		}
		return true
	})
	if !ok {
		c.t.Fatalf("cluster not healthy after %v: %s", d, why)
	}
}

// clusterNode is one line of CLUSTER NODES.
type clusterNode struct {
	id, addr, master string // master: the id of a replica's master, "-" for a master
	flags            string
	slots            [][2]int
}

// topology returns CLUSTER NODES as seen by node addr, failing t on error.
func (c *redisCluster) topology(addr string) []clusterNode {
	c.t.Helper()
	raw, err := c.do(addr, "CLUSTER", "NODES").Text()
	if err != nil {
		c.t.Fatalf("CLUSTER NODES on %s: %v", addr, err)
	}
	var out []clusterNode
	for line := range strings.Lines(raw) {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		n := clusterNode{id: f[0], addr: strings.SplitN(f[1], "@", 2)[0], flags: f[2], master: f[3]}
		for _, r := range f[8:] {
			lo, hi, found := strings.Cut(r, "-")
			if !found {
				hi = lo
			}
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if err1 == nil && err2 == nil {
				n.slots = append(n.slots, [2]int{a, b})
			}
		}
		out = append(out, n)
	}
	return out
}

// owner returns the address of the master serving slot, and that of its
// replica ("" if it has none), as live node from sees them.
func (c *redisCluster) owner(from string, slot int) (master, replica string) {
	c.t.Helper()
	nodes := c.topology(from)
	var id string
	for _, n := range nodes {
		for _, r := range n.slots {
			if strings.Contains(n.flags, "master") && !strings.Contains(n.flags, "fail") && r[0] <= slot && slot <= r[1] {
				master, id = n.addr, n.id
			}
		}
	}
	for _, n := range nodes {
		if id != "" && n.master == id && !strings.Contains(n.flags, "fail") {
			replica = n.addr
		}
	}
	return master, replica
}

// role returns what node addr says it is: "master" or "slave".
func (c *redisCluster) role(addr string) string {
	v, err := c.do(addr, "ROLE").Slice()
	if err != nil || len(v) == 0 {
		return ""
	}
	s, _ := v[0].(string)
	return s
}

// clusterProc is one process of the fleet in TestRedisCluster: its own
// cluster client, fleet and workloads.
type clusterProc struct {
	f     *Fleet
	local atomic.Bool // seen in local mode since the last reset (polled)
}

// TestRedisCluster runs a fleet on a real Redis Cluster (three masters,
// a replica each, started by the test) through redis.NewClusterClient:
// every key of the fleet lives in the one slot of its hash tag. While six
// processes call a healthy host and a failing one, a replica takes over
// its master with CLUSTER FAILOVER, and later the new master is killed
// outright, so the slot has no master until the cluster promotes the
// replica. Throughout: no caller sees an error caused by Redis. After the
// manual failover, which loses no write, the processes are in fleet mode
// and the fleet counted every retry it granted, within its bound. While
// the slot has no master, every process is in local mode (its local
// budget decides, within its own bound); once the replica is promoted,
// every process is back in fleet mode within a few seconds, and the fleet
// counted at most its bound (retries granted in the replication lag before
// the kill may be lost from its count: at most a lease per process).
func TestRedisCluster(t *testing.T) {
	redisAddr(t) // the same skip-or-require rule as every Redis test
	rc := startRedisCluster(t)
	const (
		procs = 6
		every = 50 * time.Millisecond
	)
	cfg := Config{Name: uniqueName(t), SyncEvery: every, Timeout: 500 * time.Millisecond,
		Budget:      budget.Config{Ratio: 0.1, MinPerSecond: 0.5, Window: time.Minute, Slices: 60},
		LocalBudget: budget.Config{Ratio: 0.1, MinPerSecond: 1, Window: 10 * time.Second},
		MinCalls:    1_000_000, Breaker: breaker.Config{MinCalls: 1_000_000}}
	const fleetFloor = 30.0 // MinPerSecond·Window
	hosts := []string{"api", "flaky-a", "flaky-b"}

	// Every key of the fleet hashes to one slot.
	any0 := rc.alive()[0]
	slot := -1
	for _, h := range hosts {
		key := keyPrefix + "{" + cfg.Name + "}:" + h
		s, err := rc.do(any0, "CLUSTER", "KEYSLOT", key).Int()
		if err != nil {
			t.Fatal(err)
		}
		if slot >= 0 && s != slot {
			t.Fatalf("key %s in slot %d, another key of the fleet in slot %d", key, s, slot)
		}
		slot = s
	}
	master, replica := rc.owner(any0, slot)
	if master == "" || replica == "" {
		t.Fatalf("slot %d: master %q, replica %q: %+v", slot, master, replica, rc.topology(any0))
	}

	ps := make([]*clusterProc, procs)
	for i := range ps {
		client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: rc.addrs(), ContextTimeoutEnabled: true,
			DialTimeout: 200 * time.Millisecond})
		t.Cleanup(func() { client.Close() })
		f, err := New(client, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		ps[i] = &clusterProc{f: f}
	}
	// poll marks the processes seen in local mode, until stop is closed.
	stopPoll, polled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(polled)
		for {
			select {
			case <-stopPoll:
				return
			case <-time.After(5 * time.Millisecond):
			}
			for _, p := range ps {
				if p.f.Mode() == ModeLocal {
					p.local.Store(true)
				}
			}
		}
	}()
	allFleet := func() bool {
		for _, p := range ps {
			if p.f.Mode() != ModeFleet {
				return false
			}
		}
		return true
	}
	if !eventually(5*time.Second, allFleet) {
		t.Fatalf("not every process in fleet mode on a healthy cluster")
	}

	var good []*workload
	for _, p := range ps {
		good = append(good, startPaced(newPolicy(t, p.f, "api"), 1, ok, time.Millisecond))
	}
	// The keys live on the master serving the slot.
	time.Sleep(3 * every)
	for _, h := range hosts[:1] {
		if n, err := rc.do(master, "EXISTS", keyPrefix+"{"+cfg.Name+"}:"+h).Int(); err != nil || n != 1 {
			t.Errorf("EXISTS on the slot's master %s = %d, %v; want the key there", master, n, err)
		}
	}

	// Phase A: a manual failover (CLUSTER FAILOVER on the replica).
	flakyA := startFlaky(t, ps, "flaky-a")
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	if err := rc.do(replica, "CLUSTER", "FAILOVER").Err(); err != nil {
		t.Fatalf("CLUSTER FAILOVER on %s: %v", replica, err)
	}
	if !eventually(10*time.Second, func() bool { return rc.role(replica) == "master" && rc.role(master) == "slave" }) {
		t.Fatalf("%s not master 10s after CLUSTER FAILOVER", replica)
	}
	promoted := time.Since(start)
	if !eventually(10*time.Second, allFleet) {
		t.Fatalf("not every process in fleet mode 10s after the manual failover")
	}
	backA := time.Since(start)
	time.Sleep(500 * time.Millisecond)
	endFlaky(flakyA)
	localA := countLocal(ps)

	// Phase B: the slot's master (the former replica) killed outright.
	for _, p := range ps {
		p.local.Store(false)
	}
	flakyB := startFlaky(t, ps, "flaky-b")
	time.Sleep(300 * time.Millisecond)
	start = time.Now()
	rc.nodes[replica].kill()
	if !eventually(10*time.Second, func() bool { return rc.role(master) == "master" }) {
		t.Fatalf("%s not promoted 10s after its master %s was killed", master, replica)
	}
	promotedB := time.Since(start)
	wentLocal := countLocal(ps)
	if !eventually(20*time.Second, allFleet) {
		t.Fatalf("not every process in fleet mode 20s after the kill (the replica promoted after %v)", promotedB)
	}
	backB := time.Since(start)
	time.Sleep(500 * time.Millisecond)
	endFlaky(flakyB)
	for _, w := range good {
		w.end()
	}
	close(stopPoll)
	<-polled

	// Every process gives back its leases, then the fleet's counts.
	for _, p := range ps {
		if err := p.f.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
	var goodCalls int64
	for _, w := range good {
		goodCalls += w.calls.Load()
		if w.errs.Load() != 0 {
			t.Errorf("%d successful calls returned an error: %v", w.errs.Load(), w.badErrs)
		}
	}
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: rc.alive()})
	defer client.Close()
	a := flakyA.tally(t, ps, client, cfg, "flaky-a")
	b := flakyB.tally(t, ps, client, cfg, "flaky-b")
	t.Logf("slot %d on %s (replica %s); %d processes, %d successful calls, no error",
		slot, master, replica, procs, goodCalls)
	t.Logf("manual failover: replica master after %v, %d of %d processes went local, every one in fleet mode after %v; %s",
		promoted.Round(time.Millisecond), localA, procs, backA.Round(time.Millisecond), a)
	t.Logf("master killed: replica promoted after %v, %d of %d processes went local, every one back in fleet mode after %v; %s",
		promotedB.Round(time.Millisecond), wentLocal, procs, backB.Round(time.Millisecond), b)

	// The manual failover loses no write: the fleet counted every retry it
	// granted, within its bound.
	if a.counted < a.used {
		t.Errorf("manual failover: %d fleet retries spent, the fleet counts %d", a.used, a.counted)
	}
	// The kill: the fleet counted at most its bound, and lost track of at
	// most a lease per process (retries granted in the replication lag).
	for _, x := range []flakyTally{a, b} {
		if limit := 0.1*float64(x.calls) + fleetFloor; float64(x.counted) > limit || float64(x.used) > limit+float64(x.lost()) {
			t.Errorf("%s: the fleet counts %d retries, %d spent, bound %.1f", x.host, x.counted, x.used, limit)
		}
		if x.lost() > procs*8 {
			t.Errorf("%s: %d retries spent that the fleet does not count, more than a lease per process", x.host, x.lost())
		}
		if float64(x.localRetries) > x.localBound {
			t.Errorf("%s: %d retries granted in local mode, over the local budgets' %.1f", x.host, x.localRetries, x.localBound)
		}
		if len(x.badErrs) > 0 {
			t.Errorf("%s: a failing call ended with %v, not the dependency's error", x.host, x.badErrs[0])
		}
	}
	if wentLocal != procs {
		t.Errorf("%d of %d processes went local while the slot had no master", wentLocal, procs)
	}
}

// countLocal returns the processes seen in local mode since the last reset.
func countLocal(ps []*clusterProc) int {
	n := 0
	for _, p := range ps {
		if p.local.Load() {
			n++
		}
	}
	return n
}

// flaky is the failing workload of every process on one host.
type flaky []*workload

func startFlaky(t *testing.T, ps []*clusterProc, host string) flaky {
	t.Helper()
	var out flaky
	for _, p := range ps {
		out = append(out, startPaced(newPolicy(t, p.f, host), 1, fail, time.Millisecond))
	}
	return out
}

func endFlaky(fl flaky) {
	for _, w := range fl {
		w.end()
	}
}

// flakyTally sums a failing workload's calls and retries over the
// processes, and what the fleet counts.
type flakyTally struct {
	host           string
	calls, retries int64
	used           int64 // retries spent from fleet leases
	counted        int64 // retries the fleet's window holds
	localRetries   int64 // retries granted by the local budgets
	localBound     float64
	badErrs        []error
}

func (x flakyTally) lost() int64 { return max(x.used-x.counted, 0) }

func (x flakyTally) String() string {
	return fmt.Sprintf("%s: %d failing calls, %d retries (%d spent from fleet leases, the fleet counts %d; %d granted in local mode)",
		x.host, x.calls, x.retries, x.used, x.counted, x.localRetries)
}

func (fl flaky) tally(t *testing.T, ps []*clusterProc, c redis.UniversalClient, cfg Config, host string) flakyTally {
	t.Helper()
	x := flakyTally{host: host}
	for i, w := range fl {
		calls, retries := w.calls.Load(), w.attempts.Load()-w.calls.Load()
		x.calls += calls
		x.retries += retries
		x.badErrs = append(x.badErrs, w.badErrs...)
		hs, _ := ps[i].f.hostStats(host)
		x.used += hs.Used
		x.localRetries += retries - hs.Used
		x.localBound += 0.1*float64(calls) + 10 // LocalBudget: Ratio·calls + MinPerSecond·Window
	}
	_, x.counted = redisWindow(t, c, cfg, host)
	return x
}
