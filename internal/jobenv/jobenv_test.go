package jobenv

import (
	"strings"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	j := Job{Rank: 3, Size: 4, LocalRank: 1, LocalSize: 2, CrossRank: 1, CrossSize: 2,
		Hostname: "node2", Rendezvous: "10.0.0.1:4000", JobID: "abc"}
	env := Encode(j)
	if env["HOROVOD_RANK"] != "3" || env["HOROVOD_LOCAL_SIZE"] != "2" {
		t.Errorf("HOROVOD_* names not written: %v", env)
	}
	got, err := Decode(env)
	if err != nil || got != j {
		t.Fatalf("Decode(Encode(j)) = %+v, %v; want %+v", got, err, j)
	}
	if !Present(env) || Present(map[string]string{}) {
		t.Error("Present wrong")
	}
}

func TestDecodeErrors(t *testing.T) {
	base := Encode(Job{Rank: 0, Size: 2, LocalSize: 2, CrossSize: 1, Hostname: "h", Rendezvous: "h:1"})
	tests := []struct {
		name, key, val, want string
	}{
		{"missing rank", Rank, "", "KOLO_RANK is not set"},
		{"rank not int", Rank, "x", `KOLO_RANK="x" is not an integer`},
		{"rank too big", Rank, "2", "rank 2 outside [0, 2)"},
		{"local rank too big", LocalRank, "5", "local rank 5 outside"},
		{"no rendezvous", Rendezvous, "", "no rendezvous address"},
		{"bad size", Size, "0", "size 0 < 1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{}
			for k, v := range base {
				env[k] = v
			}
			if tc.val == "" && tc.key == Rank {
				delete(env, tc.key)
			} else {
				env[tc.key] = tc.val
			}
			_, err := Decode(env)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want error containing %q", err, tc.want)
			}
		})
	}
}

func TestInterface(t *testing.T) {
	tests := []struct {
		env            map[string]string
		want, wantName string
	}{
		{nil, "", ""},
		{map[string]string{NetworkInterface: "eth0"}, "eth0", NetworkInterface},
		{map[string]string{HorovodNetworkInterface: "ib0,eth0"}, "ib0,eth0", HorovodNetworkInterface},
		{map[string]string{NetworkInterface: "eth0", HorovodNetworkInterface: "ib0"}, "eth0", NetworkInterface},
		{map[string]string{NetworkInterface: " ", HorovodNetworkInterface: "ib0"}, "ib0", HorovodNetworkInterface},
	}
	for _, tc := range tests {
		if got, name := Interface(tc.env); got != tc.want || name != tc.wantName {
			t.Errorf("Interface(%v) = %q from %q, want %q from %q", tc.env, got, name, tc.want, tc.wantName)
		}
	}
}

func TestReportsFrom(t *testing.T) {
	for _, tc := range []struct {
		env     map[string]string
		want    bool
		wantErr bool
	}{
		{map[string]string{}, true, false},
		{map[string]string{Reports: ""}, true, false},
		{map[string]string{Reports: "0"}, false, false},
		{map[string]string{Reports: "off"}, false, false},
		{map[string]string{Reports: "1"}, true, false},
		{map[string]string{Reports: "maybe"}, false, true},
	} {
		got, err := ReportsFrom(tc.env)
		if got != tc.want || (err != nil) != tc.wantErr {
			t.Errorf("ReportsFrom(%v) = %v, %v; want %v, error %v", tc.env, got, err, tc.want, tc.wantErr)
		}
	}
}
