package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
)

// chromium finds the browser that scripts/ensure-deps.sh installs for make
// test (Debian's chromium). Missing, the test fails: it never skips.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("no chromium on PATH: run scripts/ensure-deps.sh test (as root it runs apt-get install -y chromium)")
	return ""
}

// TestDashboardInABrowser loads /dashboard in headless Chromium while the
// demo's attack (and, with PostgreSQL, its outside-writes scenario) runs
// against the shop, and checks that the page loads from the shop alone,
// that every band is named on each chart and has data points, that the
// time axis is labelled, and that the console stays clean.
func TestDashboardInABrowser(t *testing.T) {
	browser := chromium(t)
	shop, hs := newTestShop(t, 1000, 100)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	type ran struct {
		outside bool
		err     error
	}
	attacked := make(chan ran, 1)
	go func() { // ends with the attack (8 runs of 1 s) and the outside-writes rounds
		_, err := attack(ctx, hs.URL, attackOptions{Duration: time.Second, Workers: 8, Burst: 20, HotProduct: "1",
			Products: 1000, OnPhase: shop.live.setPhase})
		if err != nil {
			attacked <- ran{err: err}
			return
		}
		results, err := outside(ctx, io.Discard, slog.New(slog.DiscardHandler), shop.live)
		attacked <- ran{outside: results != nil, err: err}
	}()

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.Flag("headless", "new"), chromedp.WindowSize(1280, 800))
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(allocCtx)
	defer cancelBrowser()
	if err := chromedp.Do(bctx); err != nil { // starts the browser and its tab
		t.Fatalf("chromium did not start: %v", err)
	}

	// Console errors, exceptions and browser log errors, and every request
	// the page makes, collected while it runs.
	var mu sync.Mutex // guards problems and foreign
	var problems, foreign []string
	messages := chromedp.Console(bctx)
	consoleDone := make(chan struct{})
	go func() { // ends when the browser's context is cancelled
		defer close(consoleDone)
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.IsException() {
				mu.Lock()
				problems = append(problems, m.String()+" "+m.URL)
				mu.Unlock()
			}
		}
	}()
	if _, err := chromedp.Call(bctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Listen(bctx, func(ev any) {
		if e, ok := ev.(*network.EventRequestWillBeSent); ok {
			if u := e.Request.URL; !strings.HasPrefix(u, hs.URL+"/") && !strings.HasPrefix(u, "data:") {
				mu.Lock()
				foreign = append(foreign, u)
				mu.Unlock()
			}
		}
	}); err != nil {
		t.Fatal(err)
	}

	// Every chart, every path: enough points, drawn; read once the page
	// has a point sampled after the attack ended.
	const wantPoints = 8
	ready := `(() => {
		const d = window.dashboard;
		if (!d || d.points < %d || d.seq <= %d) return false;
		for (const id of ["db", "p99", "redis", "guard"]) {
			const c = d.drawn[id];
			if (!c) return false;
			const need = id === "guard" ? ["rejects", "markers"] : ["naive", "guard", "local", "refresh"];
			for (const s of need) if (!c[s] || c[s].points < %d) return false;
		}
		return true;
	})()`
	type series struct {
		Points int     `json:"points"`
		Max    float64 `json:"max"`
		Span   float64 `json:"span"` // how wide the line is drawn, in canvas pixels
	}
	// A band as the page shows it: its label's text and box, and how many
	// vertices of the lines inside it are above zero.
	type band struct {
		Phase, Label     string
		Left, Right      float64 // the label's box on screen
		Points, Vertices int
	}
	type chart struct {
		Width     float64  `json:"width"` // the plot's width
		Bands     []band   `json:"bands"`
		TimeTicks []string `json:"ticks"`
	}
	if err := chromedp.Do(bctx, chromedp.EmulateViewport(1280, 800), chromedp.Navigate(hs.URL+"/dashboard")); err != nil {
		t.Fatal(err)
	}
	title, err := chromedp.Run(bctx, chromedp.Title())
	if err != nil {
		t.Fatal(err)
	}
	r := <-attacked
	if r.err != nil {
		t.Fatalf("attack: %v", r.err)
	}
	shop.live.mu.Lock()
	endSeq := shop.live.seq
	shop.live.mu.Unlock()
	poll := chromedp.Poll[bool](fmt.Sprintf(ready, wantPoints, endSeq, wantPoints), chromedp.WithPollingTimeout(90*time.Second),
		chromedp.WithPollingInterval(250*time.Millisecond))
	if _, err := chromedp.Run(bctx, poll); err != nil {
		t.Fatalf("the dashboard never drew its charts: %v", err)
	}
	drawn, err := chromedp.Run(bctx, chromedp.Evaluate[map[string]map[string]series](`window.dashboard.drawn`))
	if err != nil {
		t.Fatal(err)
	}
	// Read from the page itself: each band's label, and the lines' vertices
	// inside the band that stand above the plot's floor.
	charts, err := chromedp.Run(bctx, chromedp.Evaluate[map[string]chart](`(() => {
		const out = {};
		for (const svg of document.querySelectorAll("svg.chart")) {
			const grid = [...svg.querySelectorAll("line.grid")].map((l) => +l.getAttribute("y1"));
			const floor = Math.max(...grid);
			const vertices = [...svg.querySelectorAll("path.series")].flatMap((p) =>
				[...p.getAttribute("d").matchAll(/[ML]([\d.]+) ([\d.]+)/g)].map((m) => [+m[1], +m[2]]));
			const bands = [...svg.querySelectorAll("g.band")].map((g) => {
				const r = g.querySelector("rect"), label = g.querySelector("text.band-label");
				const x0 = +r.getAttribute("x"), x1 = x0 + +r.getAttribute("width");
				const inside = vertices.filter(([x]) => x >= x0 && x <= x1);
				const box = label ? label.getBoundingClientRect() : { left: 0, right: 0 };
				return { Phase: g.dataset.phase, Label: label ? label.textContent : "", Left: box.left, Right: box.right,
					Points: inside.length, Vertices: inside.filter(([, y]) => y < floor - 0.5).length };
			});
			const ticks = [...svg.querySelectorAll(".time-axis text.xtick")].map((t) => t.textContent);
			const vb = svg.viewBox.baseVal;
			out[svg.id] = { width: vb.width - 66, bands: bands, ticks: ticks };
		}
		return out;
	})()`))
	if err != nil {
		t.Fatal(err)
	}
	if len(charts) != 4 {
		t.Fatalf("charts: %d, want 4", len(charts))
	}
	want := []string{"penetration naive", "penetration guard", "stampede naive", "stampede guard",
		"zipf naive", "zipf guard", "zipf local", "zipf refresh"}
	if r.outside {
		want = append(want, "outside follower on", "outside follower off")
	} else {
		t.Log("no PostgreSQL: the outside-writes scenario did not run")
	}
	clockRE := regexp.MustCompile(`^\d\d:\d\d:\d\d$`)
	for id, c := range charts {
		var names []string
		for _, b := range c.Bands {
			names = append(names, b.Label)
			if b.Label != b.Phase {
				t.Errorf("chart %s: band %q labelled %q", id, b.Phase, b.Label)
			}
			// Every band has a line above zero where every path shows:
			// Redis commands.
			if id == "redis" && b.Vertices == 0 {
				t.Errorf("chart %s: band %q has no data points above zero (%d vertices at zero)", id, b.Phase, b.Points)
			}
		}
		if !slices.Equal(names, want) {
			t.Errorf("chart %s: bands %q, want %q", id, names, want)
		}
		bands := slices.SortedFunc(slices.Values(c.Bands), func(a, b band) int { return cmp.Compare(a.Left, b.Left) })
		for i := 1; i < len(bands); i++ {
			if bands[i-1].Right > bands[i].Left {
				t.Errorf("chart %s: band labels %q and %q overlap", id, bands[i-1].Label, bands[i].Label)
			}
		}
		if len(c.TimeTicks) < 2 || !clockRE.MatchString(c.TimeTicks[0]) {
			t.Errorf("chart %s: time axis %q, want clock times", id, c.TimeTicks)
		}
		// Lines across the whole plot (the paths that run all along).
		for _, name := range []string{"naive", "guard"} {
			if sr := drawn[id][name]; sr.Points > 1 && sr.Span < 0.9*c.Width {
				t.Errorf("chart %s: line %s spans %.0f of %.0f pixels", id, name, sr.Span, c.Width)
			}
		}
	}
	if path := os.Getenv("CG_DASHBOARD_PNG"); path != "" { // a screenshot, for a person to look at
		png, err := chromedp.Run(bctx, chromedp.CaptureScreenshot())
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	caption, err := chromedp.Run(bctx, chromedp.Evaluate[string](`document.getElementById("caption").textContent`))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(caption, "flat") || !strings.Contains(caption, "rises a little") || !(drawn["db"]["naive"].Max > drawn["db"]["guard"].Max) {
		t.Errorf("the caption does not match the lines (naive db max %v, guarded %v): %q", drawn["db"]["naive"].Max,
			drawn["db"]["guard"].Max, caption)
	}
	cancelBrowser()
	<-consoleDone

	if !strings.Contains(title, "cacheguard") {
		t.Errorf("title %q", title)
	}
	// What the attack did shows: the naive path queried the database, the
	// guarded path rejected unknown IDs, both paths' latency was measured.
	if drawn["db"]["naive"].Max <= 0 || drawn["guard"]["rejects"].Max <= 0 ||
		drawn["p99"]["naive"].Max <= 0 || drawn["p99"]["guard"].Max <= 0 || drawn["redis"]["guard"].Max <= 0 {
		t.Errorf("the charts do not show the attack: %+v", drawn)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(problems) > 0 {
		t.Errorf("console errors:\n%s", strings.Join(problems, "\n"))
	}
	if len(foreign) > 0 {
		t.Errorf("requests outside the shop (assets must be embedded): %v", foreign)
	}
}
