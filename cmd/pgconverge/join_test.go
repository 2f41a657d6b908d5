package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/internal/operator"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// `pgconverge backfill --join --wait` joins the next backfill run, applies some of its chunks
// while the run's own worker is held after its first chunk, reports them and exits 0 when the run
// completes; --join refuses --table, and without --wait a missing run is an error naming --wait.
func TestBackfillJoinCommand(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table big (id int primary key, v text)`,
		`insert into big select g, md5(g::text) from generate_series(1, 10000) g`, `analyze big`)
	base := []string{"backfill", "--source", env.SourceURL, "--target", env.TargetURL, "--log-format", "text"}
	err := run(context.Background(), append(base, "--join", "--table", "public.big"), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "drop --table") {
		t.Errorf("--join --table: %v, want a refusal", err)
	}
	err = run(context.Background(), append(base, "--join"), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--wait") {
		t.Errorf("--join with no run: %v, want an error naming --wait", err)
	}
	var out bytes.Buffer
	joined := make(chan error, 1)
	go func() {
		joined <- run(context.Background(), append(base, "--join", "--wait", "--workers", "2"), &out, pgtest.LogWriter(t))
	}()
	cfg := operator.BackfillConfig{Source: env.SourceURL, Target: env.TargetURL, Tables: []string{"public.big"}, Workers: 1, ChunkRows: 1000,
		Resume: true, Logger: slog.New(slog.NewTextHandler(pgtest.LogWriter(t), nil))}
	var once sync.Once
	cfg.AfterChunk = func(string, int64) {
		once.Do(func() {
			mon := pgtest.Connect(t, env.TargetURL)
			for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
				var n int
				if mon.QueryRow(context.Background(), `select count(*) from pgconverge.backfill_chunks where completed_at is not null`).Scan(&n) != nil || n >= 3 {
					return
				}
			}
		})
	}
	rep, err := operator.Backfill(context.Background(), cfg)
	if err != nil {
		t.Fatalf("backfill: %v", err)
	}
	select {
	case err := <-joined:
		if err != nil {
			t.Fatalf("backfill --join: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("backfill --join did not exit within 60 s of the run's end")
	}
	m := regexp.MustCompile(`joined backfill run (\d+): applied (\d+) chunks, (\d+) rows`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("backfill --join printed %q", out.String())
	}
	chunks, _ := strconv.Atoi(m[2])
	rows, _ := strconv.ParseInt(m[3], 10, 64)
	if m[1] != strconv.FormatInt(rep.RunID, 10) || chunks < 2 || rows != rep.Joined || rep.Rows+rep.Joined != 10000 {
		t.Errorf("joined run %s, %d chunks, %d rows; the run %d counts %d rows of its own and %d joined: want its id, at least 2 chunks, 10,000 rows in all",
			m[1], chunks, rows, rep.RunID, rep.Rows, rep.Joined)
	}
	pgtest.WaitConverged(t, env, "big", "id")
}
