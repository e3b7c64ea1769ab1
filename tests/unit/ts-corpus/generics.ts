// expect: {"first":1,"pair":["a",2],"boxed":{"value":"x"},"less":true}
function first<T>(xs: readonly T[]): T | undefined {
    return xs[0];
}
function pair<A, B extends number = number>(a: A, b: B): [A, B] {
    return [a, b];
}
interface Box<T> {
    value: T;
}
const box = <T,>(value: T): Box<T> => ({ value });
type Cmp = (a: number, b: number) => boolean;
const less: Cmp = (a, b) => a < b;
const m = new Map<string, Array<number>>();
m.set("k", [1]);
({ first: first<number>([1, 2]), pair: pair<string, 2>("a", 2), boxed: box<string>("x"), less: less(1, 2) })
