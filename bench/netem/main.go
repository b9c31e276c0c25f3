// Command netem is a userspace stand-in for tc netem's delay, for
// kernels without sch_netem: it joins network namespaces through TUN
// devices and forwards every IPv4 packet from one namespace to another
// after a fixed one-way delay.
//
// Each --link NS:DEV:IP names a namespace (as `ip netns` names it), a
// TUN device already created in it (`ip -n NS tuntap add dev DEV mode
// tun`, given an address on the shared subnet and set up) and the IPv4
// address that namespace owns. netem attaches to every device (it opens
// /dev/net/tun inside each namespace), reads the packets the namespace's
// kernel routes out of its device, and writes each to the device of the
// namespace that owns the packet's destination address, at
//
//	release = arrival + delay
//
// (packets to one namespace leave in the order they arrived; a packet
// for no known address is dropped and counted). The delay applies to
// every IPv4 packet that crosses namespaces, in each direction: TCP
// segments and their ACKs, UDP (gossip) alike; a round trip between two
// namespaces grows by twice it. Traffic inside a namespace (its
// loopback, its own address) never reaches a device and is not delayed.
// A forwarder wakes late by its scheduler's latency: the lateness of
// each packet (write time - release) is measured and printed at exit,
// next to the packet and byte counts, as one JSON object on stdout.
//
// netem prints "ready" on stderr once attached and runs until SIGINT or
// SIGTERM. It needs CAP_NET_ADMIN and CAP_SYS_ADMIN (setns): root.
//
//	netem --delay 2ms --link qa:t0:10.9.0.1 --link qb:t0:10.9.0.2 ...
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// queueLen bounds the packets held per destination, as netem's limit
// (1000 by default) bounds its queue: past it, packets are dropped.
const queueLen = 4096

// maxSamples bounds the lateness samples kept per destination.
const maxSamples = 1 << 20

// link is one namespace's TUN device.
type link struct {
	ns, dev string
	ip      netip.Addr
}

// parseLink parses NS:DEV:IP.
func parseLink(s string) (link, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" {
		return link{}, fmt.Errorf("--link %q: want NS:DEV:IPv4", s)
	}
	ip, err := netip.ParseAddr(parts[2])
	if err != nil || !ip.Is4() {
		return link{}, fmt.Errorf("--link %q: %q is not an IPv4 address", s, parts[2])
	}
	if len(parts[1]) >= unix.IFNAMSIZ {
		return link{}, fmt.Errorf("--link %q: device name longer than %d bytes", s, unix.IFNAMSIZ-1)
	}
	return link{ns: parts[0], dev: parts[1], ip: ip}, nil
}

// dst is the destination address of an IPv4 packet; ok is false for
// anything else (IPv6, runts).
func dst(pkt []byte) (netip.Addr, bool) {
	if len(pkt) < 20 || pkt[0]>>4 != 4 {
		return netip.Addr{}, false
	}
	return netip.AddrFrom4([4]byte(pkt[16:20])), true
}

// packet is one packet in a delay line and its release time.
type packet struct {
	data []byte
	at   time.Time
}

// line is the delay line into one namespace's device.
type line struct {
	q       chan packet
	w       io.Writer
	late    []time.Duration // lateness samples, up to maxSamples
	pkts    atomic.Int64
	bytes   atomic.Int64
	dropped atomic.Int64
}

// run writes the queued packets at their release times until q closes
// or ctx ends. It sleeps with clock_nanosleep on a locked thread with a
// 1 ns timer slack: Go's timers wake no finer than about 1 ms when the
// process is otherwise idle.
func (l *line) run(ctx context.Context) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0)
	for {
		var p packet
		select {
		case <-ctx.Done():
			return
		case pk, ok := <-l.q:
			if !ok {
				return
			}
			p = pk
		}
		sleepUntil(p.at)
		if len(l.late) < maxSamples {
			l.late = append(l.late, max(time.Since(p.at), 0))
		}
		if _, err := l.w.Write(p.data); err != nil {
			l.dropped.Add(1)
			continue
		}
		l.pkts.Add(1)
		l.bytes.Add(int64(len(p.data)))
	}
}

// sleepUntil sleeps the calling thread until t.
func sleepUntil(t time.Time) {
	d := time.Until(t)
	if d <= 0 {
		return
	}
	ts := unix.NsecToTimespec(int64(d))
	for unix.Nanosleep(&ts, &ts) == unix.EINTR {
	}
}

// forwarder routes packets among the delay lines by destination.
type forwarder struct {
	delay   time.Duration
	byIP    map[netip.Addr]*line
	unknown atomic.Int64
}

// forward queues pkt (a buffer the caller gives up) for its destination.
func (f *forwarder) forward(pkt []byte, now time.Time) {
	a, ok := dst(pkt)
	l := f.byIP[a]
	if !ok || l == nil {
		f.unknown.Add(1)
		return
	}
	select {
	case l.q <- packet{data: pkt, at: now.Add(f.delay)}:
	default:
		l.dropped.Add(1)
	}
}

// read reads r's packets and forwards them until r fails.
func (f *forwarder) read(r io.Reader) error {
	buf := make([]byte, 1<<16)
	for {
		n, err := r.Read(buf)
		if err != nil {
			return err
		}
		f.forward(slices.Clone(buf[:n]), time.Now())
	}
}

// openTun attaches to the TUN device dev of network namespace ns: it
// opens /dev/net/tun from a thread moved into ns (a TUN file belongs to
// the namespace it was opened in), then lets that thread end.
func openTun(ns, dev string) (*os.File, error) {
	type res struct {
		f   *os.File
		err error
	}
	ch := make(chan res, 1)
	go func() {
		// The thread is left in ns: it is not unlocked, so the runtime
		// ends it with this goroutine instead of reusing it.
		runtime.LockOSThread()
		nsf, err := os.Open("/var/run/netns/" + ns)
		if err != nil {
			ch <- res{err: fmt.Errorf("namespace %s: %w", ns, err)}
			return
		}
		defer nsf.Close()
		if err := unix.Setns(int(nsf.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- res{err: fmt.Errorf("setns %s: %w", ns, err)}
			return
		}
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			ch <- res{err: fmt.Errorf("open /dev/net/tun in %s: %w", ns, err)}
			return
		}
		var ifr [unix.IFNAMSIZ + 64]byte
		copy(ifr[:], dev)
		binary.NativeEndian.PutUint16(ifr[unix.IFNAMSIZ:], unix.IFF_TUN|unix.IFF_NO_PI)
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(&ifr[0]))); e != 0 {
			unix.Close(fd)
			ch <- res{err: fmt.Errorf("attach %s in %s: %w", dev, ns, e)}
			return
		}
		ch <- res{f: os.NewFile(uintptr(fd), ns+":"+dev)}
	}()
	r := <-ch
	return r.f, r.err
}

// quantile is the q-quantile of sorted s (nearest rank), 0 when empty.
func quantile(s []time.Duration, q float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	i := int(q*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// report is what netem prints at exit.
type report struct {
	DelayUS        float64 `json:"delay_us"`
	Packets        int64   `json:"packets"`
	Bytes          int64   `json:"bytes"`
	Dropped        int64   `json:"dropped"`
	Unknown        int64   `json:"unknown_dst"`
	LateP50US      float64 `json:"late_p50_us"`
	LateP99US      float64 `json:"late_p99_us"`
	LateSampled    int     `json:"late_samples"`
	SecondsRunning float64 `json:"seconds"`
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "netem:", err)
		os.Exit(1)
	}
}

// linkList is the repeated --link flag.
type linkList []link

func (l *linkList) String() string { return fmt.Sprint(*l) }
func (l *linkList) Set(s string) error {
	k, err := parseLink(s)
	if err != nil {
		return err
	}
	*l = append(*l, k)
	return nil
}

func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("netem", flag.ContinueOnError)
	fs.SetOutput(stderr)
	delay := fs.Duration("delay", 0, "one-way delay of every packet between namespaces")
	var links linkList
	fs.Var(&links, "link", "NS:DEV:IPv4, a namespace's TUN device and its address (at least 2)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *delay < 0 || *delay > 10*time.Second {
		return fmt.Errorf("--delay %v: want 0 to 10s", *delay)
	}
	if len(links) < 2 {
		return errors.New("want at least 2 --link")
	}
	seen := map[netip.Addr]bool{}
	for _, k := range links {
		if seen[k.ip] {
			return fmt.Errorf("--link: address %s given twice", k.ip)
		}
		seen[k.ip] = true
	}
	f := &forwarder{delay: *delay, byIP: map[netip.Addr]*line{}}
	var files []*os.File
	defer func() {
		for _, fl := range files {
			fl.Close()
		}
	}()
	for _, k := range links {
		fl, err := openTun(k.ns, k.dev)
		if err != nil {
			return err
		}
		files = append(files, fl)
		f.byIP[k.ip] = &line{q: make(chan packet, queueLen), w: fl}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	var wg sync.WaitGroup
	for i, k := range links {
		l := f.byIP[k.ip]
		wg.Go(func() { l.run(ctx) })
		wg.Go(func() { f.read(files[i]) })
	}
	fmt.Fprintln(stderr, "ready")
	<-ctx.Done()
	for _, fl := range files {
		fl.Close() // ends the readers
	}
	wg.Wait()
	files = nil
	rep := report{DelayUS: us(*delay), Unknown: f.unknown.Load(), SecondsRunning: time.Since(start).Seconds()}
	var late []time.Duration
	for _, l := range f.byIP {
		rep.Packets += l.pkts.Load()
		rep.Bytes += l.bytes.Load()
		rep.Dropped += l.dropped.Load()
		late = append(late, l.late...)
	}
	slices.Sort(late)
	rep.LateP50US, rep.LateP99US, rep.LateSampled = us(quantile(late, 0.5)), us(quantile(late, 0.99)), len(late)
	return json.NewEncoder(stdout).Encode(rep)
}
