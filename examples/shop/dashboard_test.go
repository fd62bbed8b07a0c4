package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
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
// demo's attack runs against the shop, and checks that the page loads from
// the shop alone (no CDN), that every chart receives points, that the
// points show what the attack did, and that the console stays clean.
func TestDashboardInABrowser(t *testing.T) {
	browser := chromium(t)
	shop, hs := newTestShop(t, 1000, 100)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	attacked := make(chan error, 1)
	go func() { // ends with the attack (8 runs of 1 s)
		_, err := attack(ctx, hs.URL, attackOptions{Duration: time.Second, Workers: 8, Burst: 20, HotProduct: "1",
			Products: 1000, OnPhase: shop.live.setPhase})
		attacked <- err
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

	// Every chart, every series: enough points, drawn.
	const wantPoints = 8
	ready := fmt.Sprintf(`(() => {
		const d = window.dashboard;
		if (!d || d.points < %d) return false;
		for (const id of ["db", "p99", "redis", "guard"]) {
			const c = d.drawn[id];
			if (!c) return false;
			for (const s of Object.values(c)) if (s.points < %d) return false;
		}
		return true;
	})()`, wantPoints, wantPoints)
	type series struct {
		Points int     `json:"points"`
		Max    float64 `json:"max"`
		Span   float64 `json:"span"` // how wide the line is drawn, in canvas pixels
	}
	type label struct {
		X    float64 `json:"x"`
		W    float64 `json:"w"`
		Text string  `json:"text"`
	}
	type chart struct {
		Width  float64 `json:"width"` // the plot's width
		Labels []label `json:"labels"`
	}
	if err := chromedp.Do(bctx, chromedp.EmulateViewport(1280, 800), chromedp.Navigate(hs.URL+"/dashboard")); err != nil {
		t.Fatal(err)
	}
	title, err := chromedp.Run(bctx, chromedp.Title())
	if err != nil {
		t.Fatal(err)
	}
	poll := chromedp.Poll[bool](ready, chromedp.WithPollingTimeout(90*time.Second),
		chromedp.WithPollingInterval(250*time.Millisecond))
	if _, err := chromedp.Run(bctx, poll); err != nil {
		t.Fatalf("the dashboard never drew its charts: %v", err)
	}
	drawn, err := chromedp.Run(bctx, chromedp.Evaluate[map[string]map[string]series](`window.dashboard.drawn`))
	if err != nil {
		t.Fatal(err)
	}
	canvases, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll("canvas").length`))
	if err != nil || canvases != 4 {
		t.Fatalf("canvases: %d %v", canvases, err)
	}
	// Readable in a 1280×800 window: phase labels apart, lines across the
	// whole plot, a caption that says what the lines show. The screenshot
	// goes to CG_DASHBOARD_PNG when set, for a person to look at.
	charts, err := chromedp.Run(bctx, chromedp.Evaluate[map[string]chart](`window.dashboard.layout`))
	if err != nil {
		t.Fatal(err)
	}
	for id, c := range charts {
		labels := slices.SortedFunc(slices.Values(c.Labels), func(a, b label) int { return cmp.Compare(a.X, b.X) })
		for i := 1; i < len(labels); i++ {
			if labels[i-1].X+labels[i-1].W > labels[i].X {
				t.Errorf("chart %s: phase labels %q and %q overlap", id, labels[i-1].Text, labels[i].Text)
			}
		}
		for name, sr := range drawn[id] {
			if sr.Points > 1 && sr.Span < 0.9*c.Width {
				t.Errorf("chart %s: line %s spans %.0f of %.0f pixels", id, name, sr.Span, c.Width)
			}
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
	if path := os.Getenv("CG_DASHBOARD_PNG"); path != "" {
		png, err := chromedp.Run(bctx, chromedp.CaptureScreenshot())
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-attacked; err != nil {
		t.Fatalf("attack: %v", err)
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
