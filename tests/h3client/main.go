// An HTTP/3 client for tlsterm's tests (quic-go): sends requests over QUIC and prints,
// as JSON on stdout, what each answer was. Several connections run at once when asked;
// the requests of one connection share it.
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
)

type answer struct {
	Status     int               `json:"status"`
	Proto      string            `json:"proto"`
	Headers    map[string]string `json:"headers"`
	BodyLen    int               `json:"body_len"`
	BodySHA256 string            `json:"body_sha256"`
	Body       string            `json:"body,omitempty"`
	PeerCN     string            `json:"peer_cn"`
	Resumed    bool              `json:"resumed"`
	Used0RTT   bool              `json:"used_0rtt"`
	Error      string            `json:"error,omitempty"`
}

// pattern is the request body of -body-bytes: byte i is i mod 251, so that a body
// shifted or cut anywhere differs.
func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i % 251)
	}
	return b
}

func request(client *http.Client, method, url string, body []byte, headers []string) answer {
	var reader io.Reader
	if body != nil {
		reader = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, url, reader)
	if err != nil {
		return answer{Error: err.Error()}
	}
	for _, h := range headers {
		name, value, _ := strings.Cut(h, ":")
		req.Header.Add(strings.TrimSpace(name), strings.TrimSpace(value))
	}
	resp, err := client.Do(req)
	if err != nil {
		return answer{Error: err.Error()}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	out := answer{Status: resp.StatusCode, Proto: resp.Proto, Headers: map[string]string{}, BodyLen: len(data)}
	if err != nil {
		out.Error = "body: " + err.Error()
	}
	if resp.TLS != nil {
		out.Resumed = resp.TLS.DidResume
		if len(resp.TLS.PeerCertificates) > 0 {
			out.PeerCN = resp.TLS.PeerCertificates[0].Subject.CommonName
		}
	}
	for name, values := range resp.Header {
		out.Headers[strings.ToLower(name)] = strings.Join(values, ", ")
	}
	sum := sha256.Sum256(data)
	out.BodySHA256 = hex.EncodeToString(sum[:])
	if len(data) <= 4096 {
		out.Body = string(data)
	}
	return out
}

// movableTransport is a UDP socket on a new local port whose connections can move to
// another one: their own connection IDs are not empty (quic-go's default for a client),
// so the server's packets name the connection whichever socket receives them.
func movableTransport() (*quic.Transport, error) {
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return nil, err
	}
	return &quic.Transport{Conn: udp, ConnectionIDLength: 8}, nil
}

// move takes conn to a new UDP socket (a new local port), as a client does after NAT
// rebinding or a change of network: it probes the new path with one of the spare
// connection IDs the server issued, then sends from it.
func move(ctx context.Context, conn *quic.Conn) error {
	transport, err := movableTransport()
	if err != nil {
		return err
	}
	path, err := conn.AddPath(transport)
	if err != nil {
		return err
	}
	if err := path.Probe(ctx); err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	return path.Switch()
}

type headerList []string

func (h *headerList) String() string     { return strings.Join(*h, ", ") }
func (h *headerList) Set(v string) error { *h = append(*h, v); return nil }

func main() {
	addr := flag.String("addr", "127.0.0.1:8443", "host:port (UDP)")
	serverName := flag.String("servername", "localhost", "SNI and :authority")
	caFile := flag.String("ca", "", "PEM file of the CA to trust (default: verify nothing)")
	certFile := flag.String("cert", "", "PEM file of a client certificate to present (with -key)")
	keyFile := flag.String("key", "", "PEM file of the client certificate's key")
	method := flag.String("method", "GET", "request method (GET_0RTT: a GET that may go in 0-RTT data)")
	path := flag.String("path", "/", "request path")
	bodyBytes := flag.Int("body-bytes", -1, "send a body of this many bytes (pattern i mod 251)")
	requests := flag.Int("requests", 1, "requests per connection, one after another")
	connections := flag.Int("connections", 1, "connections, all at once")
	concurrent := flag.Bool("concurrent", false, "a connection's requests all at once (one stream each)")
	resume := flag.Bool("resume", false, "connections one after another, resuming the first one's session")
	migrate := flag.Bool("migrate", false, "between a connection's requests, move it to a new local port")
	timeout := flag.Duration("timeout", 30*time.Second, "for everything")
	var headers headerList
	flag.Var(&headers, "header", "a request header `name: value` (repeatable)")
	flag.Parse()

	tlsConfig := &tls.Config{ServerName: *serverName, NextProtos: []string{http3.NextProtoH3}}
	if *resume {
		tlsConfig.ClientSessionCache = tls.NewLRUClientSessionCache(4)
	}
	if *certFile != "" {
		pair, err := tls.LoadX509KeyPair(*certFile, *keyFile)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		tlsConfig.Certificates = []tls.Certificate{pair}
	}
	if *caFile == "" {
		tlsConfig.InsecureSkipVerify = true
	} else {
		pem, err := os.ReadFile(*caFile)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		tlsConfig.RootCAs = pool
	}
	var body []byte
	if *bodyBytes >= 0 {
		body = pattern(*bodyBytes)
	}
	url := fmt.Sprintf("https://%s%s", *serverName, *path)

	results := make([][]answer, *connections)
	var wg sync.WaitGroup
	for c := 0; c < *connections; c++ {
		wg.Add(1)
		connection := func(c int) {
			defer wg.Done()
			// One transport per connection: its requests share one QUIC connection.
			var conn *quic.Conn
			transport := &http3.Transport{
				// Shared: the session cache must outlive each connection.
				TLSClientConfig: tlsConfig,
				QUICConfig:      &quic.Config{MaxIdleTimeout: *timeout},
				Dial: func(ctx context.Context, _ string, tlsConf *tls.Config, conf *quic.Config) (*quic.Conn, error) {
					var err error
					if !*migrate {
						conn, err = quic.DialAddrEarly(ctx, *addr, tlsConf, conf)
						return conn, err
					}
					transport, err := movableTransport()
					if err != nil {
						return nil, err
					}
					server, err := net.ResolveUDPAddr("udp", *addr)
					if err != nil {
						return nil, err
					}
					conn, err = transport.DialEarly(ctx, server, tlsConf, conf)
					return conn, err
				},
			}
			defer transport.Close()
			// Whether the connection's requests went in 0-RTT data, once they are done.
			defer func() {
				if conn == nil {
					return
				}
				for i := range results[c] {
					results[c][i].Used0RTT = conn.ConnectionState().Used0RTT
				}
			}()
			client := &http.Client{Transport: transport, Timeout: *timeout}
			if !*concurrent {
				for r := 0; r < *requests; r++ {
					if *migrate && r > 0 && conn != nil {
						ctx, cancel := context.WithTimeout(context.Background(), *timeout)
						err := move(ctx, conn)
						cancel()
						if err != nil {
							results[c] = append(results[c], answer{Error: "move: " + err.Error()})
							return
						}
					}
					results[c] = append(results[c], request(client, *method, url, body, headers))
				}
				return
			}
			// The first request opens the connection; the others then share it.
			results[c] = make([]answer, *requests)
			results[c][0] = request(client, *method, url, body, headers)
			var streams sync.WaitGroup
			for r := 1; r < *requests; r++ {
				streams.Add(1)
				go func(r int) {
					defer streams.Done()
					results[c][r] = request(client, *method, url, body, headers)
				}(r)
			}
			streams.Wait()
		}
		if *resume {
			connection(c)
		} else {
			go connection(c)
		}
	}
	wg.Wait()
	all := []answer{}
	for _, r := range results {
		all = append(all, r...)
	}
	json.NewEncoder(os.Stdout).Encode(all)
}
