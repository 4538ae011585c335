package pgcluster

import (
	"net"
	"sync"
	"testing"
)

// Proxy is a TCP endpoint on 127.0.0.1 whose address stays while its
// backend changes, as a load balancer's or a cloud endpoint's does in a
// failover: it forwards each connection to the backend it had when the
// connection arrived. SwitchTo points new connections at another backend
// and cuts the open ones; BlackHole stops forwarding on the open ones
// without closing them, which leaves their clients half-open (their writes
// succeed, nothing ever arrives). The test's Cleanup closes it.
type Proxy struct {
	ln      net.Listener
	mu      sync.Mutex
	backend string
	holdNew bool // black-hole new connections too
	conns   map[*link]struct{}
	wg      sync.WaitGroup
}

// link is one proxied connection.
type link struct {
	client, server net.Conn
	once           sync.Once
	held           chan struct{} // closed when the link is black-holed
}

// NewProxy listens on a free port of 127.0.0.1 and forwards to backend
// (host:port).
func NewProxy(tb testing.TB, backend string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &Proxy{ln: ln, backend: backend, conns: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	tb.Cleanup(p.Close)
	return p
}

// Addr returns the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Port returns the proxy's port.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// SwitchTo sends new connections to backend and closes the open ones
// that are not black-holed.
func (p *Proxy) SwitchTo(backend string) {
	p.mu.Lock()
	p.backend = backend
	var open []*link
	for l := range p.conns {
		if !l.isHeld() {
			open = append(open, l)
			delete(p.conns, l)
		}
	}
	p.mu.Unlock()
	for _, l := range open {
		l.close()
	}
}

// BlackHole stops forwarding on every open connection and keeps them
// open until Close: their clients wait for bytes that never come. New
// connections are forwarded. It returns how many connections it held.
func (p *Proxy) BlackHole() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for l := range p.conns {
		if !l.isHeld() {
			close(l.held)
			n++
		}
	}
	return n
}

// HoldNew, when on, black-holes every connection from its start: the
// proxy accepts it and forwards nothing, as a network partition does.
func (p *Proxy) HoldNew(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holdNew = on
}

// Close stops accepting and closes every connection.
func (p *Proxy) Close() {
	_ = p.ln.Close()
	p.mu.Lock()
	open := make([]*link, 0, len(p.conns))
	for l := range p.conns {
		open = append(open, l)
	}
	clear(p.conns)
	p.mu.Unlock()
	for _, l := range open {
		l.close()
	}
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		backend, hold := p.backend, p.holdNew
		p.mu.Unlock()
		server, err := net.Dial("tcp", backend)
		if err != nil {
			_ = client.Close()
			continue
		}
		l := &link{client: client, server: server, held: make(chan struct{})}
		if hold {
			close(l.held)
		}
		p.mu.Lock()
		p.conns[l] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(l, client, server)
		go p.pipe(l, server, client)
	}
}

// pipe copies from src to dst until either fails or the link is held;
// once held it reads and drops src's bytes until the link closes.
func (p *Proxy) pipe(l *link, src, dst net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-l.held:
			if err != nil {
				return
			}
			continue // black-holed: drop the bytes
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				p.drop(l)
				return
			}
		}
		if err != nil {
			p.drop(l)
			return
		}
	}
}

// drop closes l and forgets it.
func (p *Proxy) drop(l *link) {
	p.mu.Lock()
	delete(p.conns, l)
	p.mu.Unlock()
	l.close()
}

func (l *link) isHeld() bool {
	select {
	case <-l.held:
		return true
	default:
		return false
	}
}

func (l *link) close() {
	l.once.Do(func() {
		_ = l.client.Close()
		_ = l.server.Close()
	})
}
