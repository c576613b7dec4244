package redisstore_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stormguard/stormguard/idempotency/storetest"
)

// A Redis Cluster the test starts: masters with one replica each, on free
// loopback ports, each node a redis-server of its own (no persistence but
// its nodes.conf, so that a node killed and started again rejoins as it
// would in production). Stop everything with the test's cleanup.

// clusterNodeTimeout is the cluster's node timeout: a master that does not
// answer this long is failed over.
const clusterNodeTimeout = 500 * time.Millisecond

// clusterNode is one redis-server of a test cluster.
type clusterNode struct {
	t          testing.TB
	port, bus  int
	dir        string
	cmd        *exec.Cmd
	serverPath string
}

// testCluster is a Redis Cluster the test started.
type testCluster struct {
	t     testing.TB
	nodes []*clusterNode
}

// freePort returns a TCP port nothing listens on now.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// lookTools returns the paths of redis-server and redis-cli, or skips t
// (fails it with STORMGUARD_REQUIRE_SERVICES=1) if they are not installed.
func lookTools(t testing.TB) (server, cli string) {
	t.Helper()
	storetest.ServiceAddress(t, addrEnv, "Redis", "127.0.0.1:6379") // the same skip-or-require rule as every Redis test
	for _, name := range []string{"redis-server", "redis-cli"} {
		p, err := exec.LookPath(name)
		if err != nil {
			if os.Getenv("STORMGUARD_REQUIRE_SERVICES") == "1" {
				t.Fatalf("%s not installed and STORMGUARD_REQUIRE_SERVICES=1: %v", name, err)
			}
			t.Skipf("%s not installed: %v", name, err)
		}
		if name == "redis-server" {
			server = p
		} else {
			cli = p
		}
	}
	return server, cli
}

// startCluster starts a cluster of masters masters with one replica each
// and waits until it is up: every slot served, every master with its
// replica in sync.
func startCluster(t testing.TB, masters int) *testCluster {
	t.Helper()
	server, cli := lookTools(t)
	c := &testCluster{t: t}
	var addrs []string
	for range 2 * masters {
		n := &clusterNode{t: t, port: freePort(t), bus: freePort(t), dir: t.TempDir(), serverPath: server}
		n.start()
		c.nodes = append(c.nodes, n)
		addrs = append(addrs, n.addr())
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	c.waitHealthy(masters)
	return c
}

func (n *clusterNode) addr() string { return "127.0.0.1:" + strconv.Itoa(n.port) }

// start starts the node's redis-server (again, after a kill) and waits
// until it answers; it is killed when the test ends.
func (n *clusterNode) start() {
	n.t.Helper()
	expectRefusedDials(n.addr()) // the node is killed, by a test or at its end, with clients about
	n.cmd = exec.Command(n.serverPath, "--port", strconv.Itoa(n.port), "--cluster-port", strconv.Itoa(n.bus),
		"--bind", "127.0.0.1", "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", strconv.Itoa(int(clusterNodeTimeout/time.Millisecond)),
		"--dir", n.dir, "--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0",
		"--daemonize", "no", "--loglevel", "warning")
	if err := n.cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	cmd := n.cmd
	n.t.Cleanup(func() { kill(cmd) })
	c := n.client()
	defer c.Close()
	if !eventually(10*time.Second, func() bool { return c.Ping(context.Background()).Err() == nil }) {
		n.t.Fatalf("redis-server on port %d did not answer within 10s", n.port)
	}
}

// client returns a client of this node alone.
func (n *clusterNode) client() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: n.addr(), MaxRetries: -1, DialTimeout: time.Second})
}

// kill kills the node at once (SIGKILL) and waits for it.
func (n *clusterNode) kill() { kill(n.cmd) }

func kill(cmd *exec.Cmd) {
	if cmd.ProcessState != nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGCONT) // a stopped process dies only once it runs
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
}

// pause stops the node (SIGSTOP) and waits until it is stopped: it
// neither answers nor replicates, as a replica cut off or frozen.
func (n *clusterNode) pause() {
	n.t.Helper()
	if err := n.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		n.t.Fatal(err)
	}
	stat := "/proc/" + strconv.Itoa(n.cmd.Process.Pid) + "/stat"
	if !eventually(5*time.Second, func() bool {
		b, err := os.ReadFile(stat)
		i := strings.LastIndexByte(string(b), ')')
		return err == nil && i > 0 && i+2 < len(b) && b[i+2] == 'T'
	}) {
		n.t.Fatalf("redis-server on port %d not stopped after SIGSTOP", n.port)
	}
}

// resume lets a paused node run again (SIGCONT).
func (n *clusterNode) resume() {
	if err := n.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		n.t.Fatal(err)
	}
}

// info returns the fields of the node's INFO section.
func (n *clusterNode) info(section string) map[string]string {
	c := n.client()
	defer c.Close()
	s, err := c.Info(context.Background(), section).Result()
	if err != nil {
		return nil
	}
	m := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":"); ok {
			m[k] = v
		}
	}
	return m
}

// role returns "master" or "slave" (Redis's words), "" if the node does not
// answer.
func (n *clusterNode) role() string { return n.info("replication")["role"] }

// waitHealthy waits until the cluster serves every slot, as every live
// node sees it, and has masters masters, each with a replica in sync.
func (c *testCluster) waitHealthy(masters int) {
	c.t.Helper()
	var why string
	ok := eventually(30*time.Second, func() bool {
		ready := 0
		for _, n := range c.nodes {
			if n.cmd.ProcessState != nil {
				continue
			}
			cl := n.client()
			state, err := cl.ClusterInfo(context.Background()).Result()
			cl.Close()
			if err != nil || !strings.Contains(state, "cluster_state:ok") {
				why = fmt.Sprintf("node %s: cluster state not ok (%v)", n.addr(), err)
				return false
			}
			inf := n.info("replication")
			if inf["role"] == "master" && inf["connected_slaves"] == "1" && strings.Contains(inf["slave0"], "state=online") {
				ready++
			}
		}
		why = fmt.Sprintf("%d masters with a replica online, want %d", ready, masters)
		return ready == masters
	})
	if !ok {
		c.t.Fatalf("cluster not healthy within 30s: %s", why)
	}
}

// client returns a cluster client of every node.
func (c *testCluster) client() *redis.ClusterClient {
	c.t.Helper()
	var addrs []string
	for _, n := range c.nodes {
		addrs = append(addrs, n.addr())
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, DialTimeout: time.Second,
		ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second})
	c.t.Cleanup(func() { cc.Close() })
	return cc
}

// byAddr returns the node listening on addr.
func (c *testCluster) byAddr(addr string) *clusterNode {
	c.t.Helper()
	for _, n := range c.nodes {
		if n.addr() == addr {
			return n
		}
	}
	c.t.Fatalf("no node at %s", addr)
	return nil
}

// masterOf returns the master serving key, as a node that serves it says.
func (c *testCluster) masterOf(key string) *clusterNode {
	c.t.Helper()
	for _, n := range c.nodes {
		if n.cmd.ProcessState != nil {
			continue
		}
		cl := n.client()
		slot, err := cl.ClusterKeySlot(context.Background(), key).Result()
		if err != nil {
			cl.Close()
			continue
		}
		shards, err := cl.ClusterShards(context.Background()).Result()
		cl.Close()
		if err != nil {
			continue
		}
		for _, sh := range shards {
			for _, r := range sh.Slots {
				if r.Start > slot || slot > r.End {
					continue
				}
				for _, nd := range sh.Nodes {
					if nd.Role == "master" && nd.Health == "online" {
						return c.byAddr("127.0.0.1:" + strconv.FormatInt(nd.Port, 10))
					}
				}
			}
		}
	}
	c.t.Fatalf("no master found for %q", key)
	return nil
}

// replicaOf returns master's replica.
func (c *testCluster) replicaOf(master *clusterNode) *clusterNode {
	c.t.Helper()
	slave := master.info("replication")["slave0"] // ip=127.0.0.1,port=N,state=online,...
	for _, kv := range strings.Split(slave, ",") {
		if p, ok := strings.CutPrefix(kv, "port="); ok {
			return c.byAddr("127.0.0.1:" + p)
		}
	}
	c.t.Fatalf("master %s has no replica (%q)", master.addr(), slave)
	return nil
}

// eventually polls cond every 20 ms until it holds or d has passed, and
// reports whether it held.
func eventually(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}
