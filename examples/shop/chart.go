package main

import (
	"fmt"
	"image/color"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// writeChart draws the demo's table as a bar chart: database queries per
// request, naive against guarded, for each scenario; written to file as
// PNG (or SVG, PDF, by the extension), for the README.
func writeChart(rows []result, file, caption string) error {
	var scenarios []string
	perReq := map[string]map[string]float64{} // scenario -> path -> DB queries per request
	for _, r := range rows {
		if r.Path != "naive" && r.Path != "guard" {
			continue
		}
		if perReq[r.Scenario] == nil {
			perReq[r.Scenario] = map[string]float64{}
			scenarios = append(scenarios, r.Scenario)
		}
		if r.Requests > 0 {
			perReq[r.Scenario][r.Path] = float64(r.DBQueries) / float64(r.Requests)
		}
	}
	if len(scenarios) == 0 {
		return fmt.Errorf("chart: no naive and guard rows")
	}
	p := plot.New()
	p.Title.Text = "Database queries per request (lower is better)"
	p.Y.Label.Text = "DB queries / request"
	p.Y.Min = 0
	p.X.Label.Text = caption
	w := vg.Points(28)
	for i, path := range []struct {
		name  string
		color color.Color
	}{{"naive", color.RGBA{R: 0xd6, G: 0x45, B: 0x3d, A: 0xff}}, {"guard", color.RGBA{R: 0x2a, G: 0x7a, B: 0xb9, A: 0xff}}} {
		vals := make(plotter.Values, len(scenarios))
		for j, s := range scenarios {
			vals[j] = perReq[s][path.name]
		}
		bars, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return err
		}
		bars.Color, bars.LineStyle.Width = path.color, 0
		bars.Offset = vg.Length(2*i-1) * w / 2
		p.Add(bars)
		p.Legend.Add(map[string]string{"naive": "naive cache-aside", "guard": "cacheguard"}[path.name], bars)
		// Each bar's value, above it: the guarded bars are often too
		// small to see.
		labels, err := plotter.NewLabels(barLabels(vals))
		if err != nil {
			return err
		}
		labels.Offset = vg.Point{X: bars.Offset - w/2 + 1, Y: 3}
		p.Add(labels)
	}
	p.Legend.Top = true
	p.NominalX(scenarios...)
	p.Y.Max *= 1.15 // room for the labels
	return p.Save(7*vg.Inch, 3.6*vg.Inch, file)
}

// barLabels places each value's text above its bar.
func barLabels(vals plotter.Values) plotter.XYLabels {
	xy := plotter.XYLabels{XYs: make(plotter.XYs, len(vals)), Labels: make([]string, len(vals))}
	for i, v := range vals {
		xy.XYs[i] = plotter.XY{X: float64(i), Y: v}
		xy.Labels[i] = fmt.Sprintf("%.4g", v)
	}
	return xy
}
