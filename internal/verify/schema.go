package verify

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/pgsession"
	"github.com/pgconverge/pgconverge/internal/tableschema"
)

// SchemaReport is what `verify --schema` found; its JSON form is `verify --schema --format json`
// (docs/verify.md).
type SchemaReport struct {
	Tables []SchemaTable `json:"tables"`
	// Differences counts the differences that are not Pending (the exit status is 4 when it is
	// not 0); Pending those cutover --finalize removes.
	Differences int `json:"differences"`
	Pending     int `json:"pending"`
}

// SchemaTable is one table's comparison: State is "replicated" (a target table pgconverge still
// replicates into), "plain" (finalized by a cutover, or not pgconverge's), or "error" with Error
// set (a table missing on either side).
type SchemaTable struct {
	Table       string                   `json:"table"`
	State       string                   `json:"state"`
	Error       string                   `json:"error,omitempty"`
	Differences []tableschema.Difference `json:"differences"`
}

// Schema is `verify --schema`: it compares the schema of each table (cfg.Tables, else those
// pgconverge replicates into the target and those the target's last cutover retired) on the target
// with the source's, object by object (tableschema.CompareTable), and reports each difference with
// the statements that fix it. It writes nothing. A table missing on either side is reported and
// the error then wraps ErrNotVerified.
func Schema(ctx context.Context, cfg Config) (SchemaReport, error) {
	var rep SchemaReport
	src, tgt, err := pgsession.ConnectBoth(ctx, cfg.Source, cfg.Target)
	if err != nil {
		return rep, err
	}
	defer pgsession.CloseBoth(context.WithoutCancel(ctx), src, tgt)
	names, err := schemaTables(ctx, cfg, tgt)
	if err != nil {
		return rep, err
	}
	failed := 0
	for _, n := range names {
		st := SchemaTable{Table: n.String(), State: "plain", Differences: []tableschema.Difference{}}
		diffs, replicated, err := tableschema.CompareTable(ctx, src, tgt, n, cfg.Ownership)
		switch {
		case err != nil:
			st.State, st.Error = "error", err.Error()
			failed++
		case replicated:
			st.State = "replicated"
		}
		for _, d := range diffs {
			if d.Pending {
				rep.Pending++
			} else {
				rep.Differences++
			}
		}
		st.Differences = append(st.Differences, diffs...)
		rep.Tables = append(rep.Tables, st)
	}
	if failed > 0 {
		return rep, fmt.Errorf("%w: %d of %d tables could not be compared", ErrNotVerified, failed, len(names))
	}
	return rep, nil
}

// schemaTables returns the tables verify --schema compares: cfg.Tables, else the registered
// tables and those the latest cutover retired, by name, each once.
func schemaTables(ctx context.Context, cfg Config, tgt *pgx.Conn) ([]changebatch.TableName, error) {
	if len(cfg.Tables) > 0 {
		names, err := changebatch.ParseTableList(cfg.Tables)
		if err != nil {
			return nil, fmt.Errorf("--table: %w", err)
		}
		return names, nil
	}
	var names []changebatch.TableName
	seen := map[changebatch.TableName]bool{}
	reg, err := apply.RegisteredTables(ctx, tgt)
	if err != nil {
		return nil, err
	}
	for _, t := range reg {
		names, seen[t.TableName] = append(names, t.TableName), true
	}
	cut, ok, err := coverage.LatestCutover(ctx, tgt)
	if err != nil {
		return nil, err
	}
	if ok {
		for _, t := range cut.Tables {
			if !seen[t] {
				names, seen[t] = append(names, t), true
			}
		}
	}
	if len(names) == 0 {
		return nil, errors.New("the target has no tables pgconverge replicates or cut over: name them with --table")
	}
	return names, nil
}
