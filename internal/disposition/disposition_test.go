package disposition

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"testing"
)

// typed is an error type marked at its definition.
type typed struct{ role string }

func (e typed) Error() string { return "no answer from the " + e.role }

func (e typed) Mark() Mark {
	return Mark{Action: BackOff, Reason: ReasonTimeout, Hint: "check the " + e.role, Overrides: true}
}

// Marking keeps an error's message and its identity for errors.Is and errors.As.
func TestMarkingChangesNoError(t *testing.T) {
	sentinel := New("replication slot busy", Mark{Action: BackOff, Reason: ReasonSlotBusy})
	if got := sentinel.Error(); got != "replication slot busy" {
		t.Errorf("New: message %q", got)
	}
	wrapped := fmt.Errorf("prepare: %w", sentinel)
	if !errors.Is(wrapped, sentinel) || wrapped.Error() != "prepare: replication slot busy" {
		t.Errorf("a wrapped sentinel: Is %v, message %q", errors.Is(wrapped, sentinel), wrapped.Error())
	}
	inner := fmt.Errorf("read: %w", io.ErrUnexpectedEOF)
	stop := Wrap(inner, Mark{Action: Stop})
	if stop.Error() != inner.Error() || !errors.Is(stop, io.ErrUnexpectedEOF) || errors.Unwrap(stop) != inner {
		t.Errorf("Wrap: message %q, Is %v", stop.Error(), errors.Is(stop, io.ErrUnexpectedEOF))
	}
	var te typed
	if !errors.As(Wrap(fmt.Errorf("x: %w", typed{"source"}), Mark{Action: Stop}), &te) || te.role != "source" {
		t.Errorf("errors.As does not see through a mark")
	}
	if Wrap(nil, Mark{Action: Stop}) != nil {
		t.Errorf("Wrap(nil) is not nil")
	}
}

// Marks finds every mark of an error's tree, the deciding one first.
func TestMarks(t *testing.T) {
	restart := New("membership changed", Mark{Action: Restart, Reason: ReasonRestart})
	lost := New("slot lost", Mark{Action: BackOff, Reason: ReasonSlotLost, Hint: "raise max_slot_wal_keep_size"})
	silent := New("silent", Mark{Action: BackOff, Hint: "check the network"})
	cases := []struct {
		name string
		err  error
		want []Mark
	}{
		{"unmarked", fmt.Errorf("x: %w", io.EOF), nil},
		{"nil", nil, nil},
		{"one sentinel, wrapped", fmt.Errorf("a: %w", restart), []Mark{{Action: Restart, Reason: ReasonRestart}}},
		{"a typed error's mark depends on its fields", typed{"target"}, []Mark{{Action: BackOff, Reason: ReasonTimeout, Hint: "check the target", Overrides: true}}},
		{"an overriding mark first, wherever it is", fmt.Errorf("%w (%w)", Wrap(errors.New("check"), Mark{Action: Stop}), typed{"source"}),
			[]Mark{{Action: BackOff, Reason: ReasonTimeout, Hint: "check the source", Overrides: true}, {Action: Stop}}},
		{"stop before restart before back off", errors.Join(lost, restart, Wrap(io.EOF, Mark{Action: Stop})),
			[]Mark{{Action: Stop}, {Action: Restart, Reason: ReasonRestart}, {Action: BackOff, Reason: ReasonSlotLost, Hint: "raise max_slot_wal_keep_size"}}},
		{"equal strength: the most telling reason first, none last", fmt.Errorf("%w: %w", silent, lost),
			[]Mark{{Action: BackOff, Reason: ReasonSlotLost, Hint: "raise max_slot_wal_keep_size"}, {Action: BackOff, Hint: "check the network"}}},
		{"a mark on a mark", Wrap(fmt.Errorf("%w", restart), Mark{Action: BackOff, Reason: ReasonWatch}),
			[]Mark{{Action: Restart, Reason: ReasonRestart}, {Action: BackOff, Reason: ReasonWatch}}},
	}
	for _, c := range cases {
		if got := Marks(c.err); !slices.Equal(got, c.want) {
			t.Errorf("%s: Marks = %+v, want %+v", c.name, got, c.want)
		}
	}
}

// Named picks the reason declared first; a mark without one names nothing.
func TestNamed(t *testing.T) {
	cases := []struct {
		marks []Mark
		want  Reason
	}{
		{nil, ReasonNone},
		{[]Mark{{Action: Stop}}, ReasonNone},
		{[]Mark{{Reason: ReasonSchema}, {Reason: ReasonSlotBusy}}, ReasonSlotBusy},
		{[]Mark{{}, {Reason: ReasonOther}}, ReasonOther},
		{[]Mark{{Reason: ReasonTimeout}, {Reason: ReasonLeadership}, {Reason: ReasonOverlap}}, ReasonOverlap},
	}
	for _, c := range cases {
		if got := Named(c.marks); got != c.want {
			t.Errorf("Named(%+v) = %v, want %v", c.marks, got, c.want)
		}
	}
}

// The labels are the session retry metric's, which dashboards and alerts select on.
func TestReasonLabels(t *testing.T) {
	var got []string
	for r := ReasonOverlap; r <= ReasonOther; r++ {
		got = append(got, r.String())
	}
	want := []string{"overlap", "leadership", "timeout", "restart", "watch", "slot-busy", "slot-lost", "schema", "lock", "constraint", "conflict", "resources", "connection", "other"}
	if !slices.Equal(got, want) {
		t.Errorf("labels %v, want %v", got, want)
	}
	if ReasonNone.String() != "" || Stop.String() != "stop" || BackOff.String() != "back off" || Restart.String() != "restart" {
		t.Errorf("ReasonNone %q, actions %q %q %q", ReasonNone, Stop, BackOff, Restart)
	}
}
