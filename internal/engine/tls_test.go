package engine_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	mathbig "math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/internal/pgsession"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// testCA is a certificate authority made for one test: its certificate in PEM and its key.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

// newTestCA makes a certificate authority valid for an hour.
func newTestCA(t *testing.T, name string) testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: mathbig.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// serverCert returns a server certificate for 127.0.0.1 signed by ca, and its key, in PEM.
func (ca testCA) serverCert(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: mathbig.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// enableSourceTLS turns TLS on in the source cluster with a certificate for 127.0.0.1 signed by a
// new CA (ALTER SYSTEM and a reload; undone at cleanup) and returns the CA certificate's file.
// The server's files belong to the cluster's owner, as PostgreSQL requires of its key.
func enableSourceTLS(t *testing.T, env *pgtest.Env) string {
	t.Helper()
	dataDir := pgtest.Scalar[string](t, env.Source, `show data_directory`)
	st, err := os.Stat(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	owner := st.Sys().(*syscall.Stat_t)
	if os.Geteuid() != 0 && uint32(os.Geteuid()) != owner.Uid {
		t.Skipf("the source cluster belongs to uid %d: this test writes its key as root or as that user", owner.Uid)
	}
	dir, err := os.MkdirTemp("", "pgconverge-tls-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ca := newTestCA(t, "pgconverge test CA")
	certPEM, keyPEM := ca.serverCert(t)
	files := map[string][]byte{"ca.crt": ca.pem, "server.crt": certPEM, "server.key": keyPEM}
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, body, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, int(owner.Uid), int(owner.Gid)); err != nil && os.Geteuid() == 0 {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, env.Source, `alter system set ssl_cert_file = '`+filepath.Join(dir, "server.crt")+`'`,
		`alter system set ssl_key_file = '`+filepath.Join(dir, "server.key")+`'`, `alter system set ssl = on`, `select pg_reload_conf()`)
	t.Cleanup(func() {
		pgtest.Exec(t, env.Source, `alter system reset ssl`, `alter system reset ssl_cert_file`, `alter system reset ssl_key_file`, `select pg_reload_conf()`)
	})
	// The CA file is read by this process: a copy it owns.
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(caFile, ca.pem, 0o600); err != nil {
		t.Fatal(err)
	}
	return caFile
}

// withTLS returns u with sslmode and sslrootcert set.
func withTLS(t *testing.T, u, mode, rootCert string) string {
	t.Helper()
	p, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	q := p.Query()
	q.Set("sslmode", mode)
	q.Set("sslrootcert", rootCert)
	p.RawQuery = q.Encode()
	return p.String()
}

// sslmode=verify-full with the CA's file is honoured by every connection the daemon opens to the
// source, the replication connection included; a certificate from another CA is refused with the
// verification error.
func TestSourceOverVerifiedTLS(t *testing.T) {
	env := pgtest.New(t)
	caFile := enableSourceTLS(t, env)
	verified := withTLS(t, env.SourceURL, "verify-full", caFile)
	pgtest.Eventually(t, 30*time.Second, "the source accepts TLS after its reload", func() (bool, string) {
		c, err := pgsession.Connect(context.Background(), verified, "source")
		if err != nil {
			return false, err.Error()
		}
		c.Close(context.Background())
		return true, ""
	})
	other := filepath.Join(t.TempDir(), "other.crt")
	if err := os.WriteFile(other, newTestCA(t, "another CA").pem, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := pgsession.Connect(context.Background(), withTLS(t, env.SourceURL, "verify-full", other), "source")
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("connect with another CA's certificate: %v; want a certificate verification error", err)
	}

	pgtest.Exec(t, env.Source, `create table a (id int primary key, v text)`, `insert into a select g, 'v' from generate_series(1, 20) g`)
	cfg := testConfig(t, env)
	cfg.Source = verified
	startDaemon(t, cfg)
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source, `update a set v = 'tls' where id <= 5`)
	pgtest.WaitConverged(t, env, "a", "id")
	got := pgtest.Rows(t, env.Source, `select a.backend_type || ' ' || s.ssl from pg_stat_activity a join pg_stat_ssl s using (pid)
where a.application_name = 'pgconverge' and a.datname = current_database() order by 1`)
	if len(got) < 2 || !strings.Contains(strings.Join(got, ","), "walsender true") {
		t.Fatalf("the daemon's source sessions: %q; want a walsender and a client backend", got)
	}
	for _, g := range got {
		if !strings.HasSuffix(g, " true") {
			t.Errorf("the daemon's source sessions %q: one is not over TLS", got)
			break
		}
	}
}
