package report

import (
	"errors"
	"strings"
	"testing"
)

func TestFailureRoundTrip(t *testing.T) {
	f := Failure{Rank: 2, Host: "node1", Kind: KindStalled, Blames: 1, Op: "grad.w", Message: "rank 1 (node0) made no progress for 2s (recv)", Round: 3}
	got, err := DecodeFailure(EncodeFailure(f))
	if err != nil || got != f {
		t.Fatalf("DecodeFailure(EncodeFailure(%+v)) = %+v, %v", f, got, err)
	}
	long := Failure{Kind: KindException, Blames: -1, Message: strings.Repeat("x", 3*MaxFailureMessage)}
	if got, err := DecodeFailure(EncodeFailure(long)); err != nil || len(got.Message) > MaxFailureMessage+10 {
		t.Errorf("a long message travels as %d bytes (%v), want it capped at %d", len(got.Message), err, MaxFailureMessage)
	}
}

func TestDecodeFailureRefuses(t *testing.T) {
	for _, tc := range []struct{ name, in string }{
		{"not json", "{rank"},
		{"unknown kind", `{"rank":1,"kind":"gremlins","blames":-1}`},
		{"no kind", `{"rank":1,"blames":-1}`},
		{"negative rank", `{"rank":-1,"kind":"lost","blames":0}`},
		{"blames below -1", `{"rank":1,"kind":"lost","blames":-2}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if f, err := DecodeFailure([]byte(tc.in)); !errors.Is(err, ErrMalformed) {
				t.Errorf("DecodeFailure(%s) = %+v, %v; want ErrMalformed", tc.in, f, err)
			}
		})
	}
}

func TestFailureString(t *testing.T) {
	own := Failure{Rank: 1, Kind: KindException, Blames: -1, Message: "ValueError: bad"}
	blames := Failure{Rank: 0, Kind: KindPeerFailed, Blames: 1, Message: "rank 1 failed: ValueError: bad"}
	if s := own.String(); s != "exception: ValueError: bad" {
		t.Errorf("own failure reads %q", s)
	}
	if s := blames.String(); s != "peer failed (blames rank 1): rank 1 failed: ValueError: bad" {
		t.Errorf("blaming failure reads %q", s)
	}
}

func FuzzDecodeFailure(f *testing.F) {
	f.Add(EncodeFailure(Failure{Rank: 3, Kind: KindEnded, Blames: 1, Message: "m"}))
	f.Add([]byte(`{"rank":0,"kind":"lost","blames":-1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := DecodeFailure(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error does not wrap ErrMalformed: %v", err)
			}
			return
		}
		if !kinds[got.Kind] || got.Rank < 0 || got.Blames < -1 {
			t.Fatalf("accepted %+v", got)
		}
		if again, err := DecodeFailure(EncodeFailure(got)); err != nil || (len(got.Message) <= MaxFailureMessage && again != got) {
			t.Fatalf("re-encoded %+v decodes as %+v, %v", got, again, err)
		}
	})
}
