// A Go crypto/tls client for tlsterm's tests: connects once, optionally writing its
// first flight (the ClientHello) in small TCP segments, sends one HTTP/1.1 request, and
// prints what was negotiated as JSON on stdout.
package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

// splitConn writes its first `pending` bytes in pieces of `piece` bytes, each its own
// write (TCP_NODELAY is Go's default, so each leaves as its own segment).
type splitConn struct {
	net.Conn
	piece   int
	pending int
	pause   time.Duration
}

func (c *splitConn) Write(b []byte) (int, error) {
	written := 0
	for c.pending > 0 && len(b) > 0 {
		n := min(c.piece, len(b), c.pending)
		if _, err := c.Conn.Write(b[:n]); err != nil {
			return written, err
		}
		written += n
		c.pending -= n
		b = b[n:]
		// Gives the kernel time to deliver each piece before the next is queued, so
		// that the server reads them apart.
		time.Sleep(c.pause)
	}
	if len(b) == 0 {
		return written, nil
	}
	n, err := c.Conn.Write(b)
	return written + n, err
}

var groupNames = map[string]tls.CurveID{
	"x25519mlkem768": tls.X25519MLKEM768,
	"x25519":         tls.X25519,
	"p-256":          tls.CurveP256,
	"p-384":          tls.CurveP384,
}

type result struct {
	Version     string   `json:"version"`
	Group       string   `json:"group"`
	Certificate []string `json:"certificate_names"`
	Status      int      `json:"status"`
	ECHAccepted bool     `json:"ech_accepted"`
	// On an ECH rejection: the retry configs the server sent (base64), and no request.
	ECHRetryConfigs string `json:"ech_retry_configs,omitempty"`
}

func main() {
	addr := flag.String("addr", "127.0.0.1:8443", "server address")
	sni := flag.String("sni", "localhost", "server name")
	groups := flag.String("groups", "", "comma-separated groups to offer (default: Go's, X25519MLKEM768 first)")
	split := flag.Int("split", 0, "write the ClientHello in pieces of this many bytes (0: at once)")
	ech := flag.String("ech", "", "ECHConfigList (base64): encrypt the ClientHello to it")
	caFile := flag.String("cafile", "", "PEM certificates that authenticate the ECH public name on a rejection")
	flag.Parse()

	config := &tls.Config{ServerName: *sni, InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}
	if *groups != "" {
		for _, name := range strings.Split(*groups, ",") {
			id, ok := groupNames[strings.ToLower(strings.TrimSpace(name))]
			if !ok {
				fail(fmt.Errorf("unknown group %q", name))
			}
			config.CurvePreferences = append(config.CurvePreferences, id)
		}
	}
	if *ech != "" {
		list, err := base64.StdEncoding.DecodeString(*ech)
		if err != nil {
			fail(err)
		}
		config.EncryptedClientHelloConfigList = list
		config.MinVersion = tls.VersionTLS13
	}
	if *caFile != "" {
		pem, err := os.ReadFile(*caFile)
		if err != nil {
			fail(err)
		}
		config.RootCAs = x509.NewCertPool()
		config.RootCAs.AppendCertsFromPEM(pem)
	}
	tcp, err := net.DialTimeout("tcp", *addr, 10*time.Second)
	if err != nil {
		fail(err)
	}
	_ = tcp.SetDeadline(time.Now().Add(20 * time.Second))
	var conn net.Conn = tcp
	if *split > 0 {
		// The first flight is one write of the ClientHello record; a few KB covers it.
		conn = &splitConn{Conn: tcp, piece: *split, pending: 4096, pause: time.Millisecond}
	}
	client := tls.Client(conn, config)
	if err := client.Handshake(); err != nil {
		var rejected *tls.ECHRejectionError
		if errors.As(err, &rejected) {
			retry := base64.StdEncoding.EncodeToString(rejected.RetryConfigList)
			emit(result{ECHRetryConfigs: retry})
			return
		}
		fail(err)
	}
	state := client.ConnectionState()
	out := result{Version: tls.VersionName(state.Version), Group: state.CurveID.String(), ECHAccepted: state.ECHAccepted}
	if len(state.PeerCertificates) > 0 {
		out.Certificate = state.PeerCertificates[0].DNSNames
	}
	request := fmt.Sprintf("GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", *sni)
	if _, err := client.Write([]byte(request)); err != nil {
		fail(err)
	}
	response, err := http.ReadResponse(bufio.NewReader(client), nil)
	if err != nil {
		fail(err)
	}
	response.Body.Close()
	out.Status = response.StatusCode
	emit(out)
}

func emit(out result) {
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "goclient:", err)
	os.Exit(1)
}
