package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// httpStatus returns the status of GET url, polled until the server answers.
func httpStatus(t *testing.T, url string) int {
	t.Helper()
	var code int
	pgtest.Eventually(t, 30*time.Second, "GET "+url, func() (bool, string) {
		resp, err := http.Get(url)
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		io.Copy(io.Discard, resp.Body)
		code = resp.StatusCode
		return true, ""
	})
	return code
}

// --pprof serves Go's runtime profiles on the metrics address, and only with it; without
// --metrics-addr it is refused.
func TestProfilesOnTheMetricsAddress(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		flags []string
		want  int
	}{{"with", []string{"--pprof"}, http.StatusOK}, {"without", nil, http.StatusNotFound}} {
		t.Run(c.name, func(t *testing.T) {
			env := pgtest.New(t)
			pgtest.Exec(t, env.Source, `create table a (id int primary key)`)
			addr := freeAddr(t)
			startRun(t, env, append([]string{"--metrics-addr", addr}, c.flags...)...)
			if code := httpStatus(t, "http://"+addr+"/debug/pprof/heap?debug=1"); code != c.want {
				t.Errorf("/debug/pprof/heap %s --pprof: %d, want %d", c.name, code, c.want)
			}
		})
	}
	err := run(context.Background(), []string{"run", "--source", "postgres://x/y", "--target", "postgres://x/z", "--pprof"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--pprof serves on --metrics-addr") {
		t.Errorf("--pprof without --metrics-addr: %v, want a refusal", err)
	}
}
