// expect: {"area":12,"name":"rect","count":2,"desc":"rect 3x4","id":7}
abstract class Shape {
    private static count: number = 0;
    protected abstract readonly kind: string;
    declare tag: string;
    constructor(public readonly name: string, private id?: number) {
        Shape.count++;
    }
    abstract area(): number;
    static made(): number { return Shape.count; }
    getId(): number { return this.id!; }
}
class Rect extends Shape implements Iterable<number> {
    protected readonly kind = "rect";
    width!: number;
    constructor(private w: number, public h: number) {
        super("rect", 7);
        this.width = w;
    }
    override area(): number { return this.w * this.h; }
    describe(this: Rect): string { return `${this.kind} ${this.w}x${this.h}`; }
    *[Symbol.iterator](): Iterator<number> { yield this.w; }
}
const r = new Rect(3, 4);
new Rect(1, 1);
({ area: r.area(), name: r.name, count: Shape.made(), desc: r.describe(), id: r.getId() })
