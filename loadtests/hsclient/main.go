// hsclient: a TLS 1.3 full-handshake load generator for `make bench-edge`.
//
// Every connection is a new TCP connection and a full TLS 1.3 handshake
// (X25519; the server signs with its ECDSA P-256 key): no session cache, so
// nothing ever resumes (wrk and h2load do resume). On each connection it sends
// one small request with "Connection: close", reads the whole response up to
// the server's close, and checks the status line.
//
// Why Go and not Python or `openssl s_time`: on this machine a handshake costs
// the client about 0.3 ms of CPU here, against about 0.45 ms for Python's ssl
// on uvloop and 0.9 ms for s_time (OpenSSL 3.0's client path, one process per
// connection in flight); HAProxy needs about 0.45 ms, so only this client
// saturates the server from one core. The benchmark builds it from this file
// at run time (loadtests/handshake_client.py); no binary is committed.
//
// Output: one JSON object on stdout.
package main

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

type result struct {
	Connections int64   `json:"connections"`
	Errors      int64   `json:"errors"`
	Seconds     float64 `json:"seconds"`
	FirstError  string  `json:"first_error"`
}

func main() {
	addr := flag.String("addr", "127.0.0.1:443", "host:port of the TLS server")
	sni := flag.String("sni", "localhost", "server name sent in the ClientHello")
	path := flag.String("path", "/", "request path")
	concurrency := flag.Int("c", 32, "connections in flight")
	duration := flag.Duration("d", 5*time.Second, "how long to run")
	flag.Parse()
	if *concurrency < 1 || *concurrency > 4096 || *duration <= 0 || *duration > 10*time.Minute {
		fmt.Fprintln(os.Stderr, "hsclient: need 1 <= -c <= 4096 and 0 < -d <= 10m")
		os.Exit(2)
	}
	config := &tls.Config{
		ServerName:         *sni,
		InsecureSkipVerify: true, // the CertificateVerify signature is still checked
		MinVersion:         tls.VersionTLS13,
		CurvePreferences:   []tls.CurveID{tls.X25519},
		NextProtos:         []string{"http/1.1"},
		ClientSessionCache: nil, // never resume
	}
	request := []byte("GET " + *path + " HTTP/1.1\r\nHost: " + *sni + "\r\nConnection: close\r\n\r\n")
	var out result
	var firstError sync.Once
	fail := func(err error) {
		atomic.AddInt64(&out.Errors, 1)
		firstError.Do(func() { out.FirstError = err.Error() })
	}
	start := time.Now()
	deadline := start.Add(*duration)
	var wg sync.WaitGroup
	for i := 0; i < *concurrency; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 16384)
			for time.Now().Before(deadline) {
				if err := once(*addr, config, request, buf); err != nil {
					fail(err)
					time.Sleep(time.Millisecond) // a refused connect must not spin
					continue
				}
				atomic.AddInt64(&out.Connections, 1)
			}
		}()
	}
	wg.Wait()
	out.Seconds = time.Since(start).Seconds()
	_ = json.NewEncoder(os.Stdout).Encode(out)
}

// once makes one connection: handshake, request, response read to EOF.
func once(addr string, config *tls.Config, request, buf []byte) error {
	raw, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer raw.Close()
	_ = raw.SetDeadline(time.Now().Add(10 * time.Second))
	conn := tls.Client(raw, config)
	if _, err = conn.Write(request); err != nil {
		return err
	}
	got := 0
	var head []byte
	for {
		n, err := conn.Read(buf)
		if len(head) < 16 {
			head = append(head, buf[:n]...)
		}
		got += n
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	if !bytes.HasPrefix(head, []byte("HTTP/1.1 200 ")) {
		return fmt.Errorf("bad response after %d bytes: %q", got, head)
	}
	return nil
}
