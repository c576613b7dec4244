package main

import (
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// series is one named set of points.
type series struct {
	name string
	x, y []float64
	// bold draws the line thick and solid: what the chart is about.
	bold bool
}

// span is a stretch of the x axis that a panel shades over its whole
// height, under the data (an outage).
type span struct {
	name     string
	from, to float64
}

// panel is one chart of a figure: bars (positioned at x, barWidth wide)
// and/or lines.
type panel struct {
	title, xLabel, yLabel string
	bars                  []series
	barWidth              float64
	lines                 []series
	// height is the panel's height; zero means 7 cm.
	height vg.Length
	// legendLeft puts the legend in the top-left corner instead of the
	// top-right one.
	legendLeft bool
	// legendBelow puts the legend under the panel, outside the data, one
	// entry a line.
	legendBelow bool
	// shade lists the spans to shade.
	shade []span
	// noLegend draws no legend (another panel of the figure has it).
	noLegend bool
}

// chartFormat returns "png" or "svg" for a chart file name.
func chartFormat(file string) (string, error) {
	switch ext := strings.ToLower(filepath.Ext(file)); ext {
	case ".png":
		return "png", nil
	case ".svg":
		return "svg", nil
	default:
		return "", fmt.Errorf("chart file %q: want a .png or .svg name", file)
	}
}

// drawPanels draws panels stacked vertically under a title into file.
func drawPanels(file, title string, panels []panel) error {
	format, err := chartFormat(file)
	if err != nil {
		return err
	}
	plots := make([]*plot.Plot, len(panels))
	legends := make([]*plot.Legend, len(panels))
	for i, pn := range panels {
		p, l, err := pn.plot()
		if err != nil {
			return fmt.Errorf("chart %q: %w", pn.title, err)
		}
		plots[i], legends[i] = p, l
	}
	width := 22 * vg.Centimeter
	height := 1.5 * vg.Centimeter
	for _, pn := range panels {
		height += pn.h()
	}

	var canvas vg.CanvasWriterTo
	switch format {
	case "png":
		canvas = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(width, height), vgimg.UseDPI(110))}
	default:
		canvas = vgsvg.New(width, height)
	}
	dc := draw.New(canvas)
	// White background (PNG canvases start transparent).
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())

	titleStyle := plot.New().Title.TextStyle
	titleStyle.Font.Size = 14
	titleStyle.XAlign = draw.XCenter
	titleStyle.YAlign = draw.YTop
	dc.FillText(titleStyle, vg.Point{X: width / 2, Y: height - 0.3*vg.Centimeter}, title)

	body := draw.Crop(dc, 0, 0, 0, -1.2*vg.Centimeter)
	// Panels stacked top to bottom, each as tall as it asks.
	top := body.Max.Y
	for i, pn := range panels {
		c := draw.Crop(body, 2*vg.Millimeter, -4*vg.Millimeter, 0, 0)
		c.Max.Y = top - 2*vg.Millimeter
		c.Min.Y = top - pn.h() + 2*vg.Millimeter
		top -= pn.h()
		if l := legends[i]; l != nil {
			lc := c
			lc.Max.Y = c.Min.Y + pn.legendHeight()
			c.Min.Y = lc.Max.Y
			l.Draw(lc)
		}
		plots[i].Draw(c)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := canvas.WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("writing chart %s: %w", file, err)
	}
	return f.Close()
}

// h returns the panel's height, its legend below included.
func (pn panel) h() vg.Length {
	h := 7 * vg.Centimeter
	if pn.height > 0 {
		h = pn.height
	}
	return h + pn.legendHeight()
}

// legendEntry is the height of a line of a legend below a panel.
const legendEntry = 0.5 * vg.Centimeter

// legendHeight returns the height of the legend below the panel; 0 if it
// has none there.
func (pn panel) legendHeight() vg.Length {
	if !pn.legendBelow {
		return 0
	}
	return vg.Length(len(pn.bars)+len(pn.lines)+len(pn.shade))*legendEntry + 0.2*vg.Centimeter
}

// shading shades a span of the x axis over the whole height of the data
// area.
type shading struct {
	from, to float64
	color    color.Color
}

// Plot implements plot.Plotter.
func (s shading) Plot(c draw.Canvas, p *plot.Plot) {
	trX, _ := p.Transforms(&c)
	x0, x1 := max(trX(s.from), c.Min.X), min(trX(s.to), c.Max.X)
	if x1 <= x0 {
		return
	}
	c.FillPolygon(s.color, []vg.Point{{X: x0, Y: c.Min.Y}, {X: x1, Y: c.Min.Y}, {X: x1, Y: c.Max.Y}, {X: x0, Y: c.Max.Y}})
}

// Thumbnail implements plot.Thumbnailer, for the legend.
func (s shading) Thumbnail(c *draw.Canvas) {
	c.FillPolygon(s.color, []vg.Point{{X: c.Min.X, Y: c.Min.Y}, {X: c.Max.X, Y: c.Min.Y}, {X: c.Max.X, Y: c.Max.Y}, {X: c.Min.X, Y: c.Max.Y}})
}

// plot returns the panel's plot, and its legend when it goes below the
// panel (else the legend is the plot's own).
func (pn panel) plot() (*plot.Plot, *plot.Legend, error) {
	p := plot.New()
	p.Title.Text = pn.title
	p.X.Label.Text = pn.xLabel
	p.Y.Label.Text = pn.yLabel
	p.Y.Min = 0
	p.Legend.Top = true
	p.Legend.Left = pn.legendLeft
	legend := &p.Legend
	var below *plot.Legend
	if pn.legendBelow {
		l := plot.NewLegend()
		l.Top, l.Left, l.XOffs, l.Padding = true, true, 1.5*vg.Centimeter, 0.08*vg.Centimeter
		legend, below = &l, &l
	} else if pn.noLegend {
		l := plot.NewLegend()
		legend = &l // filled, never drawn
	}
	for _, sp := range pn.shade {
		sh := shading{from: sp.from, to: sp.to, color: color.NRGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0x26}}
		p.Add(sh)
		legend.Add(sp.name, sh)
	}
	p.Add(plotter.NewGrid())
	for i, s := range pn.bars {
		h := &plotter.Histogram{Width: pn.barWidth, FillColor: withAlpha(plotutil.Color(i), 0xb0)}
		h.LineStyle.Width = 0
		for j := range s.x {
			h.Bins = append(h.Bins, plotter.HistogramBin{Min: s.x[j], Max: s.x[j] + pn.barWidth, Weight: s.y[j]})
		}
		if len(h.Bins) == 0 {
			continue
		}
		p.Add(h)
		legend.Add(s.name, h)
	}
	if pn.barWidth > 0 {
		// Room for the last bar, and time starts at 0.
		xmax := 0.0
		for _, s := range pn.bars {
			for _, x := range s.x {
				xmax = max(xmax, x+pn.barWidth)
			}
		}
		p.X.Min, p.X.Max = 0, xmax*1.03
	}
	for i, s := range pn.lines {
		xys := make(plotter.XYs, len(s.x))
		for j := range s.x {
			xys[j] = plotter.XY{X: s.x[j], Y: s.y[j]}
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return nil, nil, err
		}
		l.Color = plotutil.Color(i)
		l.Width = vg.Points(1.2)
		l.Dashes = plotutil.Dashes(i)
		if s.bold {
			l.Width, l.Dashes = vg.Points(2.6), nil
		}
		p.Add(l)
		legend.Add(s.name, l)
	}
	return p, below, nil
}

func withAlpha(c color.Color, a uint8) color.Color {
	r, g, b, _ := c.RGBA()
	// Premultiplied NRGBA -> RGBA with the new alpha.
	return color.NRGBA{R: uint8(r >> 8), G: uint8(g >> 8), B: uint8(b >> 8), A: a}
}
