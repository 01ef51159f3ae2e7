// clientv3-check: etcd's own Go client (clientv3 and clientv3/concurrency
// 3.4, from Debian's golang-etcd-server-dev, built offline in GOPATH mode)
// run against the endpoints given: the STM at every isolation level that
// keeps increments, Mutex, Election, a Session's keep-alives and the
// Maintenance calls. Each check prints "ok NAME detail" or "FAIL NAME
// reason"; the exit status is 1 when one failed. Used by
// test/integration/test_meta_clientv3.py.
//
//	clientv3-check -endpoints=127.0.0.1:2379,127.0.0.1:12379
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/clientv3"
	"go.etcd.io/etcd/clientv3/concurrency"
)

var failed bool

func report(name string, err error, detail string) {
	if err != nil {
		failed = true
		fmt.Printf("FAIL %s %v\n", name, err)
		return
	}
	fmt.Printf("ok %s %s\n", name, detail)
}

// The etcd user and password (-user root:SECRET), for a meta whose etcd
// API wants the cluster secret; empty: none.
var user, password string

func client(eps []string) *clientv3.Client {
	c, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second,
		Username: user, Password: password})
	if err != nil {
		fmt.Printf("FAIL connect %v\n", err)
		os.Exit(1)
	}
	return c
}

// stm: 4 goroutines, each with its own client on one endpoint, 10
// increments each through concurrency.NewSTM.
func stm(eps []string, iso concurrency.Isolation, key string) error {
	c := client(eps)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := c.Put(ctx, key, "0"); err != nil {
		return err
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			cl := client([]string{eps[i%len(eps)]})
			defer cl.Close()
			for j := 0; j < 10; j++ {
				_, err := concurrency.NewSTM(cl, func(s concurrency.STM) error {
					// A serializable read on a member that has not
					// applied the first put yet sees no key: 0, and
					// the commit's compare sends the STM round again.
					v := s.Get(key)
					if v == "" {
						v = "0"
					}
					n, err := strconv.Atoi(v)
					if err != nil {
						return err
					}
					s.Put(key, strconv.Itoa(n+1))
					return nil
				}, concurrency.WithIsolation(iso), concurrency.WithAbortContext(ctx))
				if err != nil {
					errs <- err
					return
				}
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	r, err := c.Get(ctx, key)
	if err != nil {
		return err
	}
	if len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "40" {
		return fmt.Errorf("counter is %q, want 40", r.Kvs)
	}
	return nil
}

// mutex: 4 sessions on different endpoints take the same lock 5 times
// each; never two inside at once.
func mutex(eps []string) (string, error) {
	var inside, max, entries int32
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			cl := client([]string{eps[i%len(eps)]})
			defer cl.Close()
			s, err := concurrency.NewSession(cl, concurrency.WithTTL(10))
			if err != nil {
				errs <- err
				return
			}
			defer s.Close()
			m := concurrency.NewMutex(s, "/check/lock")
			for j := 0; j < 5; j++ {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				if err := m.Lock(ctx); err != nil {
					cancel()
					errs <- err
					return
				}
				n := atomic.AddInt32(&inside, 1)
				if n > atomic.LoadInt32(&max) {
					atomic.StoreInt32(&max, n)
				}
				atomic.AddInt32(&entries, 1)
				time.Sleep(5 * time.Millisecond)
				atomic.AddInt32(&inside, -1)
				err := m.Unlock(ctx)
				cancel()
				if err != nil {
					errs <- err
					return
				}
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return "", err
	}
	if max != 1 || entries != 20 {
		return "", fmt.Errorf("%d entries, at most %d inside at once", entries, max)
	}
	return fmt.Sprintf("%d entries, one at a time", entries), nil
}

// election: 3 candidates; the first leads, Observe sees it, and each
// resignation hands leadership to the next in campaign order.
func election(eps []string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var es []*concurrency.Election
	var ss []*concurrency.Session
	defer func() {
		for _, s := range ss {
			s.Close()
		}
	}()
	for i := 0; i < 3; i++ {
		cl := client([]string{eps[i%len(eps)]})
		defer cl.Close()
		s, err := concurrency.NewSession(cl, concurrency.WithTTL(10))
		if err != nil {
			return "", err
		}
		ss = append(ss, s)
		es = append(es, concurrency.NewElection(s, "/check/election"))
	}
	if err := es[0].Campaign(ctx, "c0"); err != nil {
		return "", err
	}
	won := make(chan int, 2)
	for i := 1; i < 3; i++ {
		go func(i int) {
			if es[i].Campaign(ctx, "c"+strconv.Itoa(i)) == nil {
				won <- i
			}
		}(i)
		time.Sleep(200 * time.Millisecond) // campaign order = key order
	}
	obs := es[2].Observe(ctx)
	var seen []string
	want := []string{"c0", "c1", "c2"}
	for i := 0; i < 3; i++ {
		for {
			r, ok := <-obs
			if !ok {
				return "", fmt.Errorf("observe ended after %v", seen)
			}
			v := string(r.Kvs[0].Value)
			if len(seen) == 0 || seen[len(seen)-1] != v {
				seen = append(seen, v)
				break
			}
		}
		if seen[i] != want[i] {
			return "", fmt.Errorf("leaders %v, want %v", seen, want)
		}
		l, err := es[0].Leader(ctx)
		if err != nil || string(l.Kvs[0].Value) != want[i] {
			return "", fmt.Errorf("Leader() = %v, %v during %s", l, err, want[i])
		}
		if i > 0 && <-won != i {
			return "", fmt.Errorf("campaign order broken at %d", i)
		}
		if err := es[i].Resign(ctx); err != nil {
			return "", err
		}
	}
	return "leaders " + strings.Join(seen, ","), nil
}

// session: a 5 s session outlives 6 s thanks to its keep-alives; its key
// goes when the session is closed (its lease revoked).
func session(eps []string) (string, error) {
	cl := client(eps)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := concurrency.NewSession(cl, concurrency.WithTTL(5))
	if err != nil {
		return "", err
	}
	if _, err := cl.Put(ctx, "/check/session", "x", clientv3.WithLease(s.Lease())); err != nil {
		return "", err
	}
	time.Sleep(6 * time.Second)
	r, err := cl.Get(ctx, "/check/session")
	if err != nil || len(r.Kvs) != 1 {
		return "", fmt.Errorf("the key went while kept alive: %v %v", r, err)
	}
	// TTL is the remaining time truncated to seconds: 0 is fine under load,
	// -1 would mean the lease is gone.
	ttl, err := cl.TimeToLive(ctx, s.Lease(), clientv3.WithAttachedKeys())
	if err != nil || ttl.TTL < 0 || ttl.GrantedTTL != 5 || len(ttl.Keys) != 1 {
		if err == nil {
			err = fmt.Errorf("TTL %d, granted %d, keys %q", ttl.TTL, ttl.GrantedTTL, ttl.Keys)
		}
		return "", fmt.Errorf("TimeToLive: %v", err)
	}
	if err := s.Close(); err != nil {
		return "", err
	}
	r, err = cl.Get(ctx, "/check/session")
	if err != nil || len(r.Kvs) != 0 {
		return "", fmt.Errorf("the key outlived the session: %v %v", r, err)
	}
	return fmt.Sprintf("lease %x kept alive, then revoked", int64(s.Lease())), nil
}

// maintenance: Status, HashKV, Defragment and a Snapshot read whole on
// every endpoint; the snapshot ends with the SHA-256 of what precedes it.
func maintenance(eps []string) (string, error) {
	cl := client(eps)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var hashes []uint32
	for _, ep := range eps {
		st, err := cl.Status(ctx, ep)
		if err != nil {
			return "", err
		}
		if st.Header.MemberId == 0 || st.Leader == 0 {
			return "", fmt.Errorf("status of %s: %v", ep, st)
		}
		if _, err := cl.Defragment(ctx, ep); err != nil {
			return "", err
		}
		h, err := cl.HashKV(ctx, ep, st.Header.Revision)
		if err != nil {
			return "", err
		}
		hashes = append(hashes, h.Hash)
	}
	rd, err := cl.Snapshot(ctx)
	if err != nil {
		return "", err
	}
	var b bytes.Buffer
	if _, err := io.Copy(&b, rd); err != nil {
		return "", err
	}
	if b.Len() < 4*4096+32 || (b.Len()-32)%4096 != 0 {
		return "", fmt.Errorf("snapshot of %d bytes", b.Len())
	}
	return fmt.Sprintf("snapshot %d bytes; HashKV %v", b.Len(), hashes), nil
}

func main() {
	epsFlag := flag.String("endpoints", "127.0.0.1:2379", "comma-separated host:port list")
	userFlag := flag.String("user", "", "etcd user:password")
	flag.Parse()
	if i := strings.IndexByte(*userFlag, ':'); i >= 0 {
		user, password = (*userFlag)[:i], (*userFlag)[i+1:]
	}
	eps := strings.Split(*epsFlag, ",")

	for _, c := range []struct {
		name string
		iso  concurrency.Isolation
	}{
		{"stm-serializable-snapshot", concurrency.SerializableSnapshot},
		{"stm-serializable", concurrency.Serializable},
		{"stm-repeatable-reads", concurrency.RepeatableReads},
	} {
		t0 := time.Now()
		err := stm(eps, c.iso, "/check/"+c.name)
		report(c.name, err, fmt.Sprintf("4 x 10 increments = 40 in %v", time.Since(t0).Round(time.Millisecond)))
	}
	d, err := mutex(eps)
	report("mutex", err, d)
	d, err = election(eps)
	report("election", err, d)
	d, err = session(eps)
	report("session", err, d)
	d, err = maintenance(eps)
	report("maintenance", err, d)
	if failed {
		os.Exit(1)
	}
}
