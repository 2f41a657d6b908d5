package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// scrape returns the metrics page's sample lines of pgconverge's own metrics.
func scrape(t *testing.T, addr string) map[string]string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "pgconverge_") {
			i := strings.LastIndexByte(line, ' ')
			out[line[:i]] = line[i+1:]
		}
	}
	return out
}

// run --metrics-addr serves rows applied per table and path, transactions, lag, watermark and
// coverage gap bytes, with exact counts.
func TestMetrics(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table a (id int primary key, v text)`,
		`insert into a select g, 'v' from generate_series(1, 50) g`)
	addr := freeAddr(t)
	startRun(t, env, "--metrics-addr", addr, "--max-rows-per-second", "5000")
	pgtest.WaitStreaming(t, env)
	pgtest.Exec(t, env.Source, `insert into a select g, 'w' from generate_series(51, 150) g`,
		`update a set v = 'u' where id <= 10`)
	pgtest.WaitSlotCaughtUp(t, env)
	want := map[string]string{
		`pgconverge_backfill_rows_total{table="public.a"}`:                          "50",
		`pgconverge_rows_applied_total{path="backfill",table="public.a"}`:           "50",
		`pgconverge_rows_applied_total{path="stream",table="public.a"}`:             "110",
		`pgconverge_duplicates_suppressed_total{path="stream",table="public.a"}`:    "0",
		`pgconverge_transactions_applied_total`:                                     "2",
		`pgconverge_changes_received_total`:                                         "110",
		`pgconverge_slot_wal_status{slot="` + env.Name + `",wal_status="reserved"}`: "1",
		`pgconverge_slot_restart_lag_bytes{slot="` + env.Name + `"}`:                "",
		`pgconverge_coverage_gap_bytes{table="public.a"}`:                           "0",
		`pgconverge_backfill_progress_ratio{trigger="initial"}`:                     "1",
		`pgconverge_apply_batch_seconds_count`:                                      "",
		`pgconverge_replication_lag_bytes`:                                          "",
		`pgconverge_watermark_lsn`:                                                  "",
		`pgconverge_streamed_transactions_open`:                                     "0",
		`pgconverge_streamed_staged_bytes`:                                          "0",
		`pgconverge_streamed_transactions_committed`:                                "0",
		`pgconverge_paused{what="stream"}`:                                          "0",
		`pgconverge_rate_limit{unit="rows_per_second"}`:                             "5000",
		`pgconverge_pacing_held{cause="wal-budget",path="backfill"}`:                "0",
		// Series a first increment must be seen against: they exist at 0 from the start.
		`pgconverge_session_retries_total{reason="constraint"}`:                 "0",
		`pgconverge_discrepancies_found_total{kind="missing",table="public.a"}`: "0",
		`pgconverge_discrepancies_repaired_total{table="public.a"}`:             "0",
	}
	pgtest.Eventually(t, 30*time.Second, "metrics", func() (bool, string) {
		got := scrape(t, addr)
		for k, v := range want {
			if g, ok := got[k]; !ok || (v != "" && g != v) {
				return false, fmt.Sprintf("%s = %q, want %q", k, g, v)
			}
		}
		return got[`pgconverge_watermark_lsn`] != "0", "watermark 0"
	})
}

// A metrics address without a host listens on the loopback address only; one with a host is
// used as given.
func TestMetricsListenAddr(t *testing.T) {
	for in, want := range map[string]string{
		":9187": "127.0.0.1:9187", "9187": "127.0.0.1:9187", "127.0.0.1:9187": "127.0.0.1:9187",
		"0.0.0.0:9187": "0.0.0.0:9187", "[::1]:9187": "[::1]:9187", "db-host.example:9187": "db-host.example:9187",
	} {
		if got := metricsListenAddr(in); got != want {
			t.Errorf("metricsListenAddr(%q) = %q, want %q", in, got, want)
		}
	}
}
