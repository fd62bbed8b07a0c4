package testcert_test

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/cacheguard/cacheguard/internal/testcert"
)

// TestServerCertificateVerifies: the server certificate Write makes
// verifies against the pool it returns, for localhost and 127.0.0.1.
func TestServerCertificateVerifies(t *testing.T) {
	dir := t.TempDir()
	pool := testcert.Write(t, dir)
	b, err := os.ReadFile(filepath.Join(dir, "server.crt"))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		t.Fatal("server.crt holds no PEM block")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"localhost", "127.0.0.1"} {
		if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: name}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: x509.NewCertPool(), DNSName: "localhost"}); err == nil {
		t.Error("verified without the CA")
	}
}

func ExampleWrite() {
	t := &testing.T{} // in a test: the test's own t
	dir, _ := os.MkdirTemp("", "certs")
	defer os.RemoveAll(dir)
	testcert.Write(t, dir)
	for _, f := range []string{"ca.crt", "server.crt", "server.key"} {
		_, err := os.Stat(filepath.Join(dir, f))
		fmt.Println(f, err == nil)
	}
	// Output:
	// ca.crt true
	// server.crt true
	// server.key true
}
