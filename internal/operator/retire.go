package operator

import (
	"context"
	"errors"
	"fmt"

	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/pgsession"
	"github.com/pgconverge/pgconverge/migrations"
)

// RetireConfig configures Retire (`pgconverge retire`).
type RetireConfig struct {
	Target string
	// Tables are comma-separated lists of "schema.table" names (changebatch.ParseTableList).
	Tables []string
}

// Validate reports every problem of the configuration at once.
func (c *RetireConfig) Validate() error {
	var errs []error
	if c.Target == "" {
		errs = append(errs, errors.New("no target: pass --target URL or set PGCONVERGE_TARGET"))
	}
	if len(c.Tables) == 0 {
		errs = append(errs, errors.New("no table: name each table to retire with --table schema.table"))
	}
	return errors.Join(errs...)
}

// Retire is `pgconverge retire`: it records in the target's ledger that no stream is to follow
// the tables any more (coverage.Retire), so that coverage reports them retired, not as a gap. It
// returns the tables it retired now (not those retired before), or an error naming each table the
// ledger does not know or a stream still follows (wrapping coverage.ErrStillFollowed); then it
// retires none.
func Retire(ctx context.Context, cfg RetireConfig) ([]changebatch.TableName, error) {
	names, err := changebatch.ParseTableList(cfg.Tables)
	if err != nil {
		return nil, fmt.Errorf("--table: %w", err)
	}
	tgt, err := pgsession.Connect(ctx, cfg.Target, "target")
	if err != nil {
		return nil, err
	}
	defer tgt.Close(context.WithoutCancel(ctx))
	if ok, err := apply.HasMetadata(ctx, tgt); err != nil {
		return nil, err
	} else if !ok {
		return nil, errors.New("the target has no pgconverge ledger (schema pgconverge): nothing to retire")
	}
	if err := migrations.Apply(ctx, tgt); err != nil {
		return nil, err
	}
	return coverage.Retire(ctx, tgt, names)
}
